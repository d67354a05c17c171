"""Issue 14, first gate: predict the step time of the 7 reference runs of `make reproduce-fig` (results/reference/)
with a CPU profile measured on this machine by `relax profile`, and put predicted beside measured.

    python -m experiments.sim.gate_cpu [--profile FILE] [--out results/sim_gate]

The profile is measured with experiments/async/cpu.yaml's model and threads (`relax profile ... --ray`) unless
--profile names one. Each run's length model is fitted to that run's metrics.jsonl (response tokens per sample;
cv assumed 0.5): lengths are an input of the simulator, not what it predicts. Writes gate_cpu.md / .json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from relax.config import validate
from relax.run_folder import RunFolder, latest_runs
from relax.sim import build

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"
RUNS = [("colocate", "cpu"), ("async", "cpu-onpolicy"), ("async", "cpu"), ("async", "cpu-verl"),
        ("async", "cpu-openrlhf"), ("async", "cpu-staleness2"), ("async", "cpu-staleness4")]
RATIOS = [("async off-policy / colocate (speed-up)", ("colocate", "cpu"), ("async", "cpu")),
          ("async on-policy / colocate (speed-up)", ("colocate", "cpu"), ("async", "cpu-onpolicy")),
          ("relax async / veRL emulated (speed-up)", ("async", "cpu-verl"), ("async", "cpu")),
          ("relax async / OpenRLHF emulated (speed-up)", ("async", "cpu-openrlhf"), ("async", "cpu"))]


def measure_profile(out: Path) -> Path:
    cmd = [sys.executable, "-m", "relax.cli", "profile", str(ROOT / "experiments/async/cpu.yaml"), "--out", str(out),
           "--ray"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out


def predict(profile: Path) -> list[dict]:
    runs = latest_runs(REFERENCE)
    rows = []
    for key in RUNS:
        d = runs[key]
        folder = RunFolder(d)
        cfg = validate(folder.config())
        sim = build(cfg, str(profile), lengths=str(d)).run()
        ends = [sim.step_end[k] for k in range(sim.steps)]
        steps = [b - a for a, b in zip([0.0] + ends, ends)][1:]
        pred = sum(steps) / len(steps)
        meas = folder.summary()["mean_step_time_s"]
        rows.append({"run": f"{key[0]}/{key[1]}", "folder": str(d.relative_to(ROOT)), "measured_s": meas,
                     "predicted_s": round(pred, 4), "error": round(pred / meas - 1, 4),
                     "host_load": (folder.host_load() or {}).get("loadavg_after", [None])[0]})
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    by = {r["run"]: r for r in rows}
    out = []
    for name, slow, fast in RATIOS:
        s, f = by[f"{slow[0]}/{slow[1]}"], by[f"{fast[0]}/{fast[1]}"]
        m, p = s["measured_s"] / f["measured_s"], s["predicted_s"] / f["predicted_s"]
        out.append({"ratio": name, "measured": round(m, 3), "predicted": round(p, 3), "error": round(p / m - 1, 4)})
    return out


def markdown(rows, rat, profile) -> str:
    lines = [f"# Issue 14 gate 1: SIMULATED vs measured (CPU profile measured by relax profile: {profile})", "",
             "| run | measured step (s) | predicted step (s) | error |", "|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['measured_s']:.4f} | {r['predicted_s']:.4f} | {r['error']:+.1%} |" for r in rows]
    lines += ["", "| ratio | measured | predicted | error |", "|---|---|---|---|"]
    lines += [f"| {r['ratio']} | {r['measured']:.3f} | {r['predicted']:.3f} | {r['error']:+.1%} |" for r in rat]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", help="a measured profile (default: measure one now)")
    ap.add_argument("--out", default=str(ROOT / "results" / "sim_gate"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = Path(args.profile) if args.profile else measure_profile(out / "cpu-measured.yaml")
    rows = predict(profile)
    rat = ratios(rows)
    (out / "gate_cpu.json").write_text(json.dumps({"simulated": True, "profile": str(profile), "runs": rows,
                                                   "ratios": rat}, indent=2))
    text = markdown(rows, rat, profile)
    (out / "gate_cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
