"""Benchmark: what the metrics sinks cost a run's step time, measured side by side with them off.

    relax bench sinks [--pairs 3] [--steps 30] [--config experiments/async/cpu.yaml] [key=value ...]

Real runs of one config, alternately with `metrics.sinks=[jsonl]` (off: jsonl is the run folder itself and is
always on) and with every sink on (`[jsonl,tensorboard,wandb,mlflow]`), in ABBA order per pair so both see the
same drift in the machine's load. Per run: mean_step_time_s (steady steps, summary.json) and the wall seconds
the driver spent inside each sink's calls (summary.json `metrics_sinks_s`). Reported: the on/off step-time
ratio per pair and its median, the mean difference with a 95% interval over pairs (Student t), and the sinks'
own seconds per step. Aim (issue 18): under 1%. On a shared 2-core machine the run-to-run noise of a CPU-scale
step is a few percent, so the interval says what this measurement can resolve. Writes JSON to `--out`
(default results/sinks_bench/<time>.json).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from experiments.bench_output import write_bench
from relax.config import load_config
from relax.run_folder import HostLoad, format_host_load

OFF = ["jsonl"]
ON = ["jsonl", "tensorboard", "wandb", "mlflow"]
# t(0.975, df) for the 95% interval of a mean over a few pairs
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pairs", type=int, default=3, help="ABBA pairs of runs (each pair: off, on, on, off)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per run")
    ap.add_argument("--config", default="experiments/async/cpu.yaml", help="the experiment every run uses")
    ap.add_argument("--out", default=None, help="JSON output (default results/sinks_bench/<time>.json)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")


def one_run(config: str, overrides: list[str], sinks: list[str], steps: int, out: Path, name: str) -> dict:
    from relax.controller import run_experiment

    cfg = load_config(config, [*overrides, f"steps={steps}", f"metrics.sinks=[{','.join(sinks)}]"])
    _, s = run_experiment(cfg, out=out, run=name, progress=False)
    return {"sinks": sinks, "mean_step_time_s": s["mean_step_time_s"], "steps": s["steps"],
            "metrics_sinks_s": s["metrics_sinks_s"], "sinks_failed": s["metrics_sinks_failed"]}


def main(args: argparse.Namespace) -> int:
    if args.pairs < 1:
        raise SystemExit("relax bench sinks: --pairs must be at least 1")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="relax-sinks-bench-") as tmp, HostLoad() as load:
        for p in range(args.pairs):
            for i, sinks in enumerate((OFF, ON, ON, OFF)):
                r = one_run(args.config, args.overrides, sinks, args.steps, Path(tmp), f"p{p}-{i}")
                runs.append(r | {"pair": p, "on": sinks == ON})
                print(f"pair {p} {'on ' if sinks == ON else 'off'}: step {r['mean_step_time_s']:.4f} s")
    failed = [r for r in runs if r["sinks_failed"]]
    if failed:
        raise SystemExit(f"relax bench sinks: a sink failed during a run, the comparison is void: {failed[0]}")
    ratios, diffs = [], []
    for p in range(args.pairs):
        on = statistics.mean(r["mean_step_time_s"] for r in runs if r["pair"] == p and r["on"])
        off = statistics.mean(r["mean_step_time_s"] for r in runs if r["pair"] == p and not r["on"])
        ratios.append(on / off)
        diffs.append((on - off) / off)
    mean = statistics.mean(diffs)
    half = T975.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    per_step = {n: statistics.mean(r["metrics_sinks_s"].get(n, 0.0) / r["steps"] for r in runs if r["on"])
                for n in ON}
    off_step = statistics.mean(r["mean_step_time_s"] for r in runs if not r["on"])
    summary = {"ratio_on_off_median": statistics.median(ratios), "ratios": ratios,
               "overhead_mean": mean, "overhead_ci95_half": half,
               "sink_seconds_per_step": per_step,
               "sink_share_of_step": sum(per_step.values()) / off_step, "aim": 0.01}
    out = {"bench": "sinks", "args": {k: v for k, v in vars(args).items() if k not in ("func", "argv")},
           "summary": summary, "runs": runs, "host_load": load.record}
    path = write_bench(out, "sinks", args.out)
    band = f" +- {100 * half:.1f}%" if half is not None else ""
    print(f"sinks on / off step time: median ratio {summary['ratio_on_off_median']:.4f} over {args.pairs} pairs; "
          f"overhead {100 * mean:+.1f}%{band} (95%); the sinks' own calls {1000 * sum(per_step.values()):.1f} ms "
          f"per step = {100 * summary['sink_share_of_step']:.2f}% of a step; aim < 1%; "
          f"load {format_host_load(load.record)}; wrote {path}")
    return 0
