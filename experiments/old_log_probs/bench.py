"""Benchmark: the PPO ratio's old log-probs from the ActorFwd service against the rollout engine's, side by side.

    relax bench old_log_probs [--config experiments/async/cpu.yaml] [--pairs 2] [--steps 10] [--out FILE] [k=v ...]

Issue 15 item 0: the choice is explicit in the config (`algorithm.old_log_probs: rollout | actor_fwd`); this
measures its cost and its effect on the mismatch. Each pair is two `relax run`s of the same config and seed, one
per way, in alternating order (rollout first, then actor_fwd first) so both see the same drift of this shared
machine. The engine runs in bfloat16 against the fp32 trainer by default (`rollout.dtype=bfloat16`), the mismatch
ActorFwd exists to take out of the ratio. Per run, over the steps past the first: the step time and the
machine's CPU per step (cost); the trainer-vs-engine log-prob gap on the rollout's tokens (`logp_gap_abs`, the
same in both ways: it is the mismatch itself), the share of tokens the PPO clip cut and the ratio's KL estimate
(`clip_frac`, `approx_kl`: the mismatch that stays in the ratio), and with ActorFwd the gap it removed
(`old_rollout_gap_abs`) and the share of rows scored at their own version. Writes JSON to `--out` (default
results/old_log_probs_bench/<time>.json) and its runs beside it.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from experiments import launch
from experiments.bench_output import write_bench
from relax.run_folder import RunFolder, format_host_load

WAYS = ("rollout", "actor_fwd")
STEP_KEYS = ("step_time_s", "logp_gap_abs", "clip_frac", "approx_kl", "old_rollout_gap_abs",
             "old_log_probs_exact_share")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="experiments/async/cpu.yaml")
    p.add_argument("--pairs", type=int, default=2, help="run pairs, each one run per way in alternating order")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", default=None, help="JSON path (default results/old_log_probs_bench/<time>.json)")
    p.add_argument("overrides", nargs="*", help="dotted overrides for both ways (default: rollout.dtype=bfloat16)")


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.fmean(vals), 6) if vals else None


def one(config: str, way: str, overrides: list[str], out: Path, name: str, steps: int) -> dict:
    folder, summary = launch.run(config, [*overrides, f"algorithm.old_log_probs={way}"], out=out, run=name,
                                 steps=steps)
    run = RunFolder(folder)
    rows = run.metrics()
    steady = [r for r in rows if r["step"] > 0] or rows
    procs = summary.get("cpu_by_process_per_step_s") or {}
    return {"way": way, "run": str(folder), "steps": len(rows), **{k: _mean(steady, k) for k in STEP_KEYS},
            # the machine's core-seconds a step, every process of the run, and the ActorFwd service's own share
            "cpu_per_step_s": round(sum(procs.values()), 4) if procs else None,
            "actor_fwd_cpu_per_step_s": procs.get("ray::ActorFwdRole"), "samples_lost": summary["samples_lost"],
            "samples_duplicated": summary["samples_duplicated"], "host_load": format_host_load(run.host_load())}


def summarise(runs: list[dict]) -> dict:
    """Per way the median of each run's means; the step-time and CPU ratios actor_fwd / rollout, median of the
    pairs' ratios (each pair ran back to back)."""
    by = {w: [r for r in runs if r["way"] == w] for w in WAYS}
    med = {w: {k: statistics.median(v) if (v := [r[k] for r in rs if r.get(k) is not None]) else None
               for k in (*STEP_KEYS, "cpu_per_step_s", "actor_fwd_cpu_per_step_s")} for w, rs in by.items()}
    pairs = list(zip(by["rollout"], by["actor_fwd"]))

    def ratio(key):
        vals = [b[key] / a[key] for a, b in pairs if a.get(key) and b.get(key)]
        return round(statistics.median(vals), 3) if vals else None

    return {"median": med, "step_time_ratio": ratio("step_time_s"), "cpu_ratio": ratio("cpu_per_step_s"),
            "clip_frac_ratio": ratio("clip_frac"), "approx_kl_ratio": ratio("approx_kl")}


def main(args: argparse.Namespace) -> int:
    overrides = args.overrides or ["rollout.dtype=bfloat16"]
    path = write_bench({"status": "running"}, "old_log_probs", args.out)
    runs_dir = path.with_suffix("")
    runs = []
    for i in range(args.pairs):
        for way in (WAYS if i % 2 == 0 else WAYS[::-1]):
            runs.append(one(args.config, way, overrides, runs_dir, f"{way}-{i}", args.steps))
            print(f"[old_log_probs] pair {i} {way}: step {runs[-1]['step_time_s']} s, clip_frac "
                  f"{runs[-1]['clip_frac']}, load {runs[-1]['host_load']}", flush=True)
    result = {"config": args.config, "overrides": overrides, "steps": args.steps, "pairs": args.pairs,
              "runs": runs, **summarise(runs)}
    write_bench(result, "old_log_probs", str(path))
    for way, m in result["median"].items():
        print(f"{way:>10}: step {m['step_time_s']} s, cpu/step {m['cpu_per_step_s']} core-s, logp gap "
              f"{m['logp_gap_abs']}, clip_frac {m['clip_frac']}, approx_kl {m['approx_kl']}, removed gap "
              f"{m['old_rollout_gap_abs']}")
    print(f"actor_fwd / rollout: step time {result['step_time_ratio']}x, cpu {result['cpu_ratio']}x, clip_frac "
          f"{result['clip_frac_ratio']}x, approx_kl {result['approx_kl_ratio']}x -> {path}")
    return 0
