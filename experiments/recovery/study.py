"""Recovery study: real process kills, DCS peer recovery against disk, weight-sync bandwidth, elastic phases.

    relax study recovery [--out results] [--only spare cold bench elastic]

Writes `<out>/recovery/`:
  runs/                  the runs (recovery.json, metrics.jsonl, summary.json, trace.json each)
  recovery.json          everything the drawer needs (below), with the 1-min load average around each part
Parts:
  spare    experiments/async/cpu-recovery.yaml: SIGKILL of a Rollout replica (a configured warm spare takes
           over: `health.spare_rollout: 1`), of the Reference (Tier 1) and of the Actor (Tier 2, global restart)
  cold     the same experiment without a spare and with one fault, the Rollout replica's kill: the replacement
           is a new process (Ray worker, imports, model, weights from a DCS peer), the honest restart time
  bench    `relax bench dcs` (dcs_bench.py here): DCS weight sync against a raw gloo broadcast over loopback
           measured the same way, 256 MB (buckets 16, 64 and 256 MB: a model of a few hundred MB amortises the
           per-version handshake as real ones do) and the tiny model's size with process groups reused / per
           transfer
  elastic  a live run driven over its HTTP API: 1 replica, scale out to 2, 2 replicas, scale in to 1, 1 replica
           (groups generated per replica and per second in each phase; elastic.py here)
Per killed role (analysis/recovery.py): detect, ready, serving (Rollout), back to the previous throughput, the
start-up phases of the replacement, DCS peer transfer vs a disk reload of the same weights (s, bytes), and the
run's lost / duplicated samples (must be 0). The paper publishes no recovery timings: these are ours only.
Each part's overrides and the bench's arguments: variants.yaml beside this file.
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

import yaml

from experiments import launch
from relax.api.cli import post_stop
from relax.run_folder import HostLoad, RunFolder

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments/async/cpu-recovery.yaml"
ELASTIC_CONFIG = "experiments/async/cpu.yaml"
VARIANTS = yaml.safe_load((Path(__file__).parent / "variants.yaml").read_text())
PARTS = ["spare", "cold", "bench", "elastic"]


def run_fault_experiment(root: Path, name: str, overrides: list[str]) -> dict:
    from analysis.recovery import table
    from relax.config import load_config

    cfg = load_config(CONFIG, overrides)
    shutil.rmtree(root / "runs" / cfg.name / cfg.profile / name, ignore_errors=True)  # a previous attempt's
    print(f"[recovery] {name}: relax run {CONFIG.relative_to(ROOT)} {' '.join(overrides)}", flush=True)
    run_dir, summary = launch.run(CONFIG, overrides, out=root / "runs", run=name)
    load = RunFolder(run_dir).host_load()
    rows = table(run_dir)
    for r in rows:
        r["setting"] = name
    return {"run": str(run_dir.relative_to(root)), "overrides": overrides, "rows": rows,
            "samples_trained": summary.get("samples_trained"), "samples_lost": summary["samples_lost"],
            "samples_duplicated": summary["samples_duplicated"], "steps": summary["steps"],
            "load_before": load["loadavg_before"][0], "load_after": load["loadavg_after"][0],
            "wall_s": load["wall_s"]}


def run_bench(root: Path) -> dict:
    out = {}
    for fname, args in VARIANTS["bench"].items():
        cmd = [sys.executable, "-m", "relax.cli", "bench", "dcs", *args, "--out", str(root / fname)]
        print(f"[recovery] bench: {' '.join(cmd[1:])}", flush=True)
        with HostLoad() as load:
            subprocess.run(cmd, cwd=ROOT, check=True)
        out[fname.removesuffix(".json")] = {"command": "relax " + " ".join(cmd[4:-2]),
                                            "load_before": load.record["loadavg_before"][0],
                                            **json.loads((root / fname).read_text())}
    return out


def run_elastic(root: Path, groups: int = 8) -> dict:
    from experiments.recovery.elastic import run_phases

    run_dir = root / "runs" / "async" / "cpu-elastic" / "elastic"
    shutil.rmtree(run_dir, ignore_errors=True)
    proc = launch.spawn(ELASTIC_CONFIG, VARIANTS["elastic"], out=root / "runs", run="elastic", api_port=0,
                        log=root / "elastic.log", cwd=ROOT)
    print(f"[recovery] elastic: {' '.join(proc.cmd[1:])}", flush=True)
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
                                min_seconds=VARIANTS["elastic_phase_s"])
        except AssertionError as err:  # e.g. a phase timed out: say so, keep the rest
            result = {"error": str(err), "phases": [], "operations": []}
        # The run's `steps` outlast the phases on any machine; it ends here, its steps kept (POST /run/stop).
        if proc.poll() is None:
            post_stop(url, token).raise_for_status()
        proc.wait(timeout=900)
    finally:
        proc.kill()  # a no-op once it ended
    summary, load = RunFolder(run_dir).summary(), RunFolder(run_dir).host_load()
    return {**result, "command": " ".join(proc.cmd[1:]), "run": str(run_dir.relative_to(root)),
            "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
            "load_before": load["loadavg_before"][0], "load_after": load["loadavg_after"][0], "wall_s": load["wall_s"]}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=PARTS)


def main(args: argparse.Namespace) -> int:
    root = args.out / "recovery"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recovery.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    res["cpus"] = os.cpu_count()
    res["note"] = ("CPU scale (tiny Qwen3, 2-core machine); the Relax paper publishes no recovery timings. "
                   "Rollout with a spare: a configured warm standby (health.spare_rollout) takes over.")
    for part in args.only:
        t0 = time.time()
        if part in ("spare", "cold"):
            res[part] = run_fault_experiment(root, part, VARIANTS[part])
        elif part == "bench":
            res["bench"] = run_bench(root)
        else:
            res["elastic"] = run_elastic(root)
        print(f"[recovery] {part}: {time.time() - t0:.0f} s", flush=True)
        path.write_text(json.dumps(res, indent=2, default=str))
    from analysis.recovery import markdown

    rows = [r for k in ("spare", "cold") if k in res for r in res[k]["rows"]]
    print(markdown(rows), end="")
    return 0
