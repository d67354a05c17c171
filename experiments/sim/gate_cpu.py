"""Issue 14, first gate: predict the step time of the 7 runs of `make reproduce-fig` with a CPU profile measured on
this machine by `relax profile`, and put predicted beside measured (SIMULATED beside measured).

    python -m experiments.sim.gate_cpu --fresh [--out results/sim_gate]     # profile + the 7 runs, now
    python -m experiments.sim.gate_cpu [--runs results/reference] [--profile FILE ...]

--fresh measures the profiles and runs the 7 experiments (`relax reproduce --only ...`) in this invocation, one after
the other, so profiles and runs see the same machine; without it the runs are read from --runs (default: the
committed reference set) and the profiles are measured now unless --profile names them. One profile is measured
(`relax profile CONFIG --ray`) per distinct set of threads among the 7 configs, with the first config that runs it:
colocate's rollout and actor run 2 threads, async's 1, and a span at 2 threads runs ~1.4x faster on 2 cores, so
each run is priced by the profile timed at its own threads (the cost model refuses any other). Each run's length
model is fitted to
that run's metrics.jsonl (response tokens per sample; cv assumed 0.5): lengths are an input of the simulator, not
what it predicts.

Step time is compared twice, as the mean and as the median over steps 1.. (step 0 carries start-up). The gate is
judged on the median: a shared machine adds the odd multi-second step (another process's burst) that the model does
not claim to predict, and one such step moves a 40-step mean by 10%. Both columns are written. With --fresh the
profiles are measured again after the runs (OUT/after/) and the runs priced by those too: the spread between the two
takes is the resolution of the gate. Writes gate_cpu.md / .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from relax.bus import PROCESSES as BUS_PROCESSES
from relax.config import validate
from relax.run_folder import RunFolder, latest_runs
from relax.sim import build
from relax.sim.hardware import load_hardware
from relax.sim.measure import profile_threads
from relax.sim.output import metrics_rows, summarize

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "results" / "reference"
# Each run's name in analysis/reproduce.py's EXPERIMENTS (what --fresh runs) and its (experiment, profile) folder
GATE_RUNS = {"colocate": ("colocate", "cpu"), "async-on-policy": ("async", "cpu-onpolicy"),
             "async-off-policy": ("async", "cpu"), "verl-emulated": ("async", "cpu-verl"),
             "openrlhf-emulated": ("async", "cpu-openrlhf"), "staleness-2": ("async", "cpu-staleness2"),
             "staleness-4": ("async", "cpu-staleness4")}
RATIOS = [("async off-policy / colocate (speed-up)", ("colocate", "cpu"), ("async", "cpu")),
          ("async on-policy / colocate (speed-up)", ("colocate", "cpu"), ("async", "cpu-onpolicy")),
          ("relax async / veRL emulated (speed-up)", ("async", "cpu-verl"), ("async", "cpu")),
          ("relax async / OpenRLHF emulated (speed-up)", ("async", "cpu-openrlhf"), ("async", "cpu"))]


def measure_profiles(out: Path) -> list[Path]:
    """One profile per distinct threads among the gate's configs, measured with the first config that runs them."""
    from analysis.reproduce import EXPERIMENTS
    from relax.config import load_config

    out.mkdir(parents=True, exist_ok=True)
    first: dict[tuple, tuple[str, list[str]]] = {}
    for name, config, overrides in EXPERIMENTS:
        if name in GATE_RUNS:
            first.setdefault(tuple(profile_threads(load_config(str(ROOT / config), overrides)).values()),
                             (config, overrides))
    paths = []
    for threads, (config, overrides) in first.items():
        paths.append(out / f"cpu-measured-{'-'.join(map(str, threads))}.yaml")
        subprocess.run([sys.executable, "-m", "relax.cli", "profile", config, *overrides, "--out", str(paths[-1]),
                        "--ray"], check=True, cwd=ROOT)
    return paths


def profile_for(cfg, profiles: list[Path]) -> Path:
    want = profile_threads(cfg)
    for p in profiles:
        if load_hardware(p).threads == want:
            return p
    raise SystemExit(f"gate_cpu: no profile measured at {want} threads for {cfg.name}/{cfg.profile} (profiles: "
                     f"{', '.join(map(str, profiles))}); measure one with relax profile CONFIG --ray")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def predict(profiles: list[Path], root: Path = REFERENCE) -> list[dict]:
    runs = latest_runs(root)
    rows = []
    for key in GATE_RUNS.values():
        d = runs[key]
        folder = RunFolder(d)
        cfg = validate(folder.config())
        profile = profile_for(cfg, profiles)
        sim = build(cfg, str(profile), lengths=str(d)).run()
        ends = [sim.step_end[k] for k in range(sim.steps)]
        pred = [b - a for a, b in zip([0.0] + ends, ends)][1:]
        meas = [m["step_time_s"] for m in folder.metrics()][1:]
        load, summ = folder.host_load() or {}, folder.summary()
        row = {"run": f"{key[0]}/{key[1]}", "folder": _rel(d), "profile": _rel(profile), "steps": len(meas),
               "host_load": [load.get("loadavg_before", [None])[0], load.get("loadavg_after", [None])[0]],
               # Where the time went, measured (None for runs older than the CPU accounting): the machine's busy
               # cores over the training, and the roles' span seconds per step, wall (busy) and CPU. The SIMULATED
               # busy is the roles' span seconds in the model, a wait for a core included (as measured busy is).
               "host_cpu_cores": summ.get("host_cpu_cores"),
               "roles_busy_per_step_s": round(sum(summ.get("busy_per_step_s", {}).values()), 4),
               "roles_cpu_per_step_s": round(sum(summ["cpu_per_step_s"].values()), 4) if "cpu_per_step_s" in summ
               else None,
               "simulated_busy_per_step_s": round(sum(summarize(sim, metrics_rows(sim, "cpu"), "cpu", "cpu")
                                                      ["busy_per_step_s"].values()), 4),
               # The machine's core-seconds a step, measured (busy cores x the mean step) and by process group
               # (summary.json cpu_by_process_per_step_s, steps 0.. included), beside the cores the model holds
               "core_s_per_step": round(summ["host_cpu_cores"] * summ["mean_step_time_s"], 4)
               if summ.get("host_cpu_cores") else None,
               "core_s_by_group": group_cpu(summ.get("cpu_by_process_per_step_s")),
               "simulated_core_s_per_step": round(sim.core_s / sim.steps, 4),
               # The bus operations a step, measured by kind over every process (summary.json bus_calls_per_step:
               # None for runs older than the count), beside the calls the model prices by kind (relax.sim.sim)
               "bus_calls_per_step": bus_calls(summ.get("bus_calls_per_step")),
               "simulated_bus_calls_per_step": {k: round(n / sim.steps, 3) for k, n in sorted(sim.bus_calls.items())}}
        for stat, fn in (("mean", statistics.fmean), ("median", statistics.median)):
            m, p = fn(meas), fn(pred)
            row[stat] = {"measured_s": round(m, 4), "predicted_s": round(p, 4), "error": round(p / m - 1, 4)}
        rows.append(row)
    return rows


# How the gate groups the run's processes (relax/metrics/processes.py labels): what the model puts on the cores
# (the roles; the bus, through the callers' wall; the background: Ray, DCS) and what it leaves off (the driver).
GROUPS = {"roles": lambda n: n.endswith("Role"),
          "bus": lambda n: n in (*BUS_PROCESSES, "ray::GroupQueue"),  # with the rollout pool's claim queue
          "DCS": lambda n: n == "ray::DCSCoordinator",
          "driver": lambda n: n == "driver"}


def group_cpu(by_process: dict | None) -> dict | None:
    if not by_process:
        return None
    out = {g: 0.0 for g in [*GROUPS, "Ray and the rest"]}
    for name, v in by_process.items():
        out[next((g for g, match in GROUPS.items() if match(name)), "Ray and the rest")] += v
    return {g: round(v, 4) for g, v in out.items()}


BUS_KINDS = ("put", "write", "fetch", "empty_fetch", "wait")


def bus_calls(by_process: dict | None) -> dict | None:
    if not by_process:
        return None
    return {k: round(sum(c.get(k, 0.0) for c in by_process.values()), 3) for k in BUS_KINDS}


def ratios(rows: list[dict], stat: str) -> list[dict]:
    by = {r["run"]: r[stat] for r in rows}
    out = []
    for name, slow, fast in RATIOS:
        s, f = by[f"{slow[0]}/{slow[1]}"], by[f"{fast[0]}/{fast[1]}"]
        m, p = s["measured_s"] / f["measured_s"], s["predicted_s"] / f["predicted_s"]
        out.append({"ratio": name, "measured": round(m, 3), "predicted": round(p, 3), "error": round(p / m - 1, 4)})
    return out


def markdown(rows, rat, profiles, runs_root, after: dict | None = None) -> str:
    """The gate's tables; `after`: {"runs", "ratios" (of the medians)} priced by the profiles taken after the runs."""
    lines = ["# Issue 14 gate 1: SIMULATED vs measured step time (aim: within 10%, judged on the median)", "",
             f"Profiles (measured by relax profile, one per threads; each row names its own): "
             f"{', '.join(map(_rel, profiles))}. Runs: {runs_root}.", "",
             "| run | measured median (s) | SIMULATED median (s) | error | measured mean (s) | SIMULATED mean (s) "
             "| error | host load before -> after | busy cores, measured | roles' busy / CPU s per step, measured "
             "| roles' busy s per step (a core's wait included), SIMULATED |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md, mn = r["median"], r["mean"]
        lines.append(f"| {r['run']} | {md['measured_s']:.4f} | {md['predicted_s']:.4f} | {md['error']:+.1%} | "
                     f"{mn['measured_s']:.4f} | {mn['predicted_s']:.4f} | {mn['error']:+.1%} | "
                     f"{r['host_load'][0]} -> {r['host_load'][1]} | {r.get('host_cpu_cores')} | "
                     f"{r.get('roles_busy_per_step_s')} / {r.get('roles_cpu_per_step_s')} | "
                     f"{r.get('simulated_busy_per_step_s')} |")
    lines += ["", "Where the cores go, core-seconds per step: the machine's (busy cores x mean step) and by process, "
              "measured, beside the cores the model holds (roles' work, the bus's own CPU, stretched by the idle "
              "session's background), SIMULATED.", "",
              "| run | machine, measured | " + " | ".join(f"{g}, measured" for g in [*GROUPS, "Ray and the rest"])
              + " | cores held, SIMULATED |", "|---|---|" + "---|" * (len(GROUPS) + 2)]
    for r in rows:
        g = r.get("core_s_by_group") or {}
        lines.append(f"| {r['run']} | {r.get('core_s_per_step')} | "
                     + " | ".join(str(g.get(k)) for k in [*GROUPS, "Ray and the rest"])
                     + f" | {r.get('simulated_core_s_per_step')} |")
    lines += ["", "Bus operations a step, measured over every process by kind (relax.bus.Bus.calls), beside the calls "
              "the model prices, SIMULATED: calls at a put + fetch's cost each (a stage's fetch and write back are "
              "one) and idle consumers' empty lookups (one each time a consumer idles; the engine's first idle on a "
              "partition looks twice).",
              "", "| run | " + " | ".join(f"{k}, measured" for k in BUS_KINDS)
              + " | calls, SIMULATED | empty_fetch, SIMULATED |", "|---|" + "---|" * (len(BUS_KINDS) + 2)]
    for r in rows:
        b, sb = r.get("bus_calls_per_step") or {}, r.get("simulated_bus_calls_per_step") or {}
        lines.append(f"| {r['run']} | " + " | ".join(str(b.get(k)) for k in BUS_KINDS)
                     + f" | {sb.get('call', 0)} | {sb.get('empty_fetch', 0)} |")
    for stat in ("median", "mean"):
        lines += ["", f"| ratio of {stat} step times | measured | SIMULATED | error |", "|---|---|---|---|"]
        lines += [f"| {r['ratio']} | {r['measured']:.3f} | {r['predicted']:.3f} | {r['error']:+.1%} |"
                  for r in rat[stat]]
    if after:
        lines += ["", "The same runs priced by the profiles measured again after them (--fresh): two takes of one "
                  "machine, minutes apart; the spread is the gate's resolution.", "",
                  "| run | SIMULATED median, profile before (s) | error | SIMULATED median, profile after (s) "
                  "| error |",
                  "|---|---|---|---|---|"]
        for r, a in zip(rows, after["runs"]):
            lines.append(f"| {r['run']} | {r['median']['predicted_s']:.4f} | {r['median']['error']:+.1%} | "
                         f"{a['median']['predicted_s']:.4f} | {a['median']['error']:+.1%} |")
        for r in after["ratios"]:
            lines.append(f"| ratio: {r['ratio']} | | | {r['predicted']:.3f} | {r['error']:+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", type=Path, help="a measured profile, once per threads the runs "
                    "use (default: measure them now)")
    ap.add_argument("--runs", type=Path, default=REFERENCE, help="results root holding the 7 runs (default: the "
                    "committed reference set)")
    ap.add_argument("--fresh", action="store_true", help="measure the profiles and run the 7 experiments now, into "
                    "OUT/runs (about 8 minutes on a quiet 2-core machine)")
    ap.add_argument("--out", default=str(ROOT / "results" / "sim_gate"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profiles = args.profile or measure_profiles(out)
    runs_root = args.runs
    after = None
    if args.fresh:
        runs_root = out / "runs"
        subprocess.run([sys.executable, "-m", "relax.cli", "reproduce", "--only", *GATE_RUNS, "--out", str(runs_root),
                        "--no-figures"], check=True, cwd=ROOT)
        # The same profiles taken again once the runs are done: how far two takes minutes apart disagree is the
        # resolution the gate has on a shared machine (each cost moved by 10-30% between takes on 2026-12-06).
        again = predict(measure_profiles(out / "after"), runs_root)
        after = {"runs": again, "ratios": ratios(again, "median")}
    rows = predict(profiles, runs_root)
    rat = {stat: ratios(rows, stat) for stat in ("median", "mean")}
    (out / "gate_cpu.json").write_text(json.dumps({"simulated": True, "profiles": list(map(_rel, profiles)),
                                                   "runs_root": str(runs_root), "runs": rows, "ratios": rat,
                                                   "profiles_after_runs": after}, indent=2))
    text = markdown(rows, rat, profiles, _rel(runs_root), after)
    (out / "gate_cpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
