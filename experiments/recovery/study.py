"""Recovery study: real process kills, DCS peer recovery against disk, weight-sync bandwidth, elastic phases.

    .venv/bin/python -m relax.fault.study [--out results] [--only spare cold bench elastic]

Writes `<out>/recovery/`:
  runs/                  the runs (recovery.json, metrics.jsonl, summary.json, trace.json each)
  recovery.json          everything the drawer needs (below), with the 1-min load average around each part
Parts:
  spare    experiments/async/cpu-recovery.yaml: SIGKILL of a Rollout replica (a configured warm spare takes
           over: `health.spare_rollout: 1`), of the Reference (Tier 1) and of the Actor (Tier 2, global restart)
  cold     the same experiment without a spare and with one fault, the Rollout replica's kill: the replacement
           is a new process (Ray worker, imports, model, weights from a DCS peer), the honest restart time
  bench    relax.weights.dcs_bench: DCS weight sync against a raw gloo broadcast over loopback measured the same
           way, 256 MB (buckets 16, 64 and 256 MB: a model of a few hundred MB amortises the per-version handshake as real ones do) and the tiny model's size with process groups reused / per transfer
  elastic  a live run driven over its HTTP API: 1 replica, scale out to 2, 2 replicas, scale in to 1, 1 replica
           (groups generated per replica and per second in each phase; relax/api/elastic.py)
Per killed role (relax.fault.report): detect, ready, serving (Rollout), back to the previous throughput, the
start-up phases of the replacement, DCS peer transfer vs a disk reload of the same weights (s, bytes), and the
run's lost / duplicated samples (must be 0). The paper publishes no recovery timings: these are ours only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments/async/cpu-recovery.yaml"
COLD = ["profile=cpu-recovery-cold", "health.spare_rollout=0", "steps=30",
        "faults=[{role: rollout, replica: 1, at_step: 5, kind: kill}]"]
ELASTIC = ["profile=cpu-elastic", "steps=64", "rollout.replicas=1", "health.spare_rollout=0", "faults=[]",
           "max_staleness=4", "health.heartbeat_timeout_s=600",
           # Generation made the bottleneck, as at cluster scale where rollout dominates the step: long sampled
           # responses (T=2 rarely samples EOS) keep each replica busy while the Actor's step stays short, so
           # throughput can follow the replica count. Rewards of these runs are not a learning result.
           "rollout.max_new_tokens=48", "rollout.temperature=2.0", "rollout.chunk_groups=1"]
BENCH = [(["--mb", "256", "--bucket-mb", "16", "64", "256", "--groups", "reused", "fresh", "--repeat", "5"], "bench_256mb.json"),
         (["--mb", "1.6", "--bucket-mb", "64", "--groups", "reused", "fresh", "--repeat", "5"], "bench_tiny.json")]
ELASTIC_PHASE_S = 8.0  # each phase at least this long (generation is bursty behind the staleness gate)
PARTS = ["spare", "cold", "bench", "elastic"]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "RAY_AUTH_MODE": "disabled"}


def run_fault_experiment(root: Path, name: str, overrides: list[str]) -> dict:
    from relax.config import load_config
    from relax.controller import run_experiment
    from relax.fault.report import table

    cfg = load_config(CONFIG, overrides)
    shutil.rmtree(root / "runs" / cfg.name / cfg.profile / name, ignore_errors=True)  # a previous attempt's
    before, t0 = _load(), time.time()
    print(f"[recovery] {name}: relax run {CONFIG.relative_to(ROOT)} {' '.join(overrides)}", flush=True)
    run_dir, summary = run_experiment(cfg, out=root / "runs", run=name, progress=False)
    rows = table(run_dir)
    for r in rows:
        r["setting"] = name
    return {"run": str(run_dir.relative_to(root)), "overrides": overrides, "rows": rows,
            "samples_trained": summary.get("samples_trained"), "samples_lost": summary["samples_lost"],
            "samples_duplicated": summary["samples_duplicated"], "steps": summary["steps"],
            "load_before": before, "load_after": _load(), "wall_s": round(time.time() - t0, 1)}


def run_bench(root: Path) -> dict:
    out = {}
    for args, fname in BENCH:
        before = _load()
        cmd = [sys.executable, "-m", "relax.weights.dcs_bench", *args, "--out", str(root / fname)]
        print(f"[recovery] bench: {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, cwd=ROOT, env=_env(), check=True)
        out[fname.removesuffix(".json")] = {"command": "python " + " ".join(cmd[1:-2]), "load_before": before,
                                            **json.loads((root / fname).read_text())}
    return out


def run_elastic(root: Path, groups: int = 8) -> dict:
    from relax.api.elastic import run_phases

    before, t0 = _load(), time.time()
    cmd = [sys.executable, "-m", "relax.cli", "run", "experiments/async/cpu.yaml", "--no-progress", "--out",
           str(root / "runs"), "--run", "elastic", "--api-port", "0", *ELASTIC]
    print(f"[recovery] elastic: {' '.join(cmd[1:])}", flush=True)
    run_dir = root / "runs" / "async" / "cpu-elastic" / "elastic"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = open(root / "elastic.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while not (run_dir / "api.json").exists():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the elastic run ended or never served its API (see {root / 'elastic.log'})")
            time.sleep(0.2)
        url = json.loads((run_dir / "api.json").read_text())["url"]
        token = (run_dir / "api_token").read_text().strip()
        try:
            result = run_phases(url, token, groups=groups, timeout=400, alive=lambda: proc.poll() is None,
                                min_seconds=ELASTIC_PHASE_S)
        except AssertionError as err:  # e.g. the run ended before the last phase: say so, keep the rest
            result = {"error": str(err), "phases": [], "operations": []}
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**result, "command": " ".join(cmd[1:]), "run": str(run_dir.relative_to(root)),
            "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
            "load_before": before, "load_after": _load(), "wall_s": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=PARTS)
    args = ap.parse_args(argv)
    root = args.out / "recovery"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recovery.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    res["cpus"] = os.cpu_count()
    res["note"] = ("CPU scale (tiny Qwen3, 2-core machine); the Relax paper publishes no recovery timings. "
                   "Rollout with a spare: a configured warm standby (health.spare_rollout) takes over.")
    for part in args.only:
        t0 = time.time()
        if part == "spare":
            res["spare"] = run_fault_experiment(root, "spare", ["profile=cpu-recovery"])
        elif part == "cold":
            res["cold"] = run_fault_experiment(root, "cold", COLD)
        elif part == "bench":
            res["bench"] = run_bench(root)
        else:
            res["elastic"] = run_elastic(root)
        print(f"[recovery] {part}: {time.time() - t0:.0f} s", flush=True)
        path.write_text(json.dumps(res, indent=2, default=str))
    from relax.fault.report import markdown

    rows = [r for k in ("spare", "cold") if k in res for r in res[k]["rows"]]
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
