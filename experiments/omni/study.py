"""The omni study: async against colocate on the omni task, through the engine (Ray roles + bus).

    relax study omni [--config experiments/omni/cpu.yaml] [--seeds 0 1 2] [--steps N] [--out results] [k=v ...]

Per seed, one supervised warm-up (cached; each seed its own), then one `relax run` per mode
(experiments/launch.py), one after the other on the same machine: async (off-policy, the config's max_staleness)
and colocate (`mode=colocate`, staleness 0, the rollout engine asleep while the Actor trains). Writes the runs
under OUT/omni/cpu/ and OUT/omni/omni_results.json: per mode and seed the step time, wall time, training reward
(mean of the first and of the last quarter of the steps) and the reward-per-step series, held-out greedy accuracy
before/after RL, the host load around each run; per mode the means over seeds (`modes`); and the async/colocate
step-time ratio beside the published one (Qwen3-Omni-30B-A3B, 16 GPUs) and the published reward start and end
(analysis/published.py). `analysis.omni.draw_omni` turns it into results/tables/omni.{md,csv} and
results/figures/omni.png (held-out gain with a 95% interval over the seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from analysis import published
from experiments import launch
from relax.config import load_config
from relax.run_folder import RunFolder

RESULTS_FILE = "omni_results.json"
MODES = ("async", "colocate")


def quarter_means(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def run_mode(config: str, mode: str, out: Path, steps: int | None, overrides: list[str], seed: int = 0) -> dict:
    name = f"{mode}-s{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    over = [*overrides, f"mode={mode}", f"seed={seed}"]
    cfg = load_config(config, over)
    run_dir, summary = launch.run(config, over, out=out, run=name, steps=steps)
    run = RunFolder(run_dir)
    host = run.host_load()
    rows = run.metrics()
    rewards = [r["reward_mean"] for r in rows]
    start, end = quarter_means(rewards)
    return {
        "run": str(run_dir.relative_to(out)), "mode": mode, "seed": seed, "max_staleness": cfg.max_staleness,
        "steps": len(rows), "mean_step_time_s": summary["mean_step_time_s"], "train_time_s": summary["train_time_s"],
        "reward_start": round(start, 4), "reward_end": round(end, 4),
        **{k: summary.get(k) for k in ("eval_accuracy_start", "eval_accuracy_end", "eval_reward_start",
                                       "eval_reward_end", "pipeline_efficiency", "trainer_wait_share",
                                       "sleep_wake_s_mean")},
        "samples_lost": summary["samples_lost"],
        "series": {"step": [r["step"] for r in rows], "wall_time_s": [r["wall_time_s"] for r in rows],
                   "step_time_s": [r["step_time_s"] for r in rows], "reward": rewards},
        "host_load": host,
    }


MEANS = ("mean_step_time_s", "train_time_s", "reward_start", "reward_end", "eval_accuracy_start", "eval_accuracy_end",
         "eval_reward_start", "eval_reward_end")


def mode_summary(runs: list[dict]) -> dict:
    """One mode over its seeds: the mean of each number, the first seed's series and host load, every run."""
    def mean(k):
        vals = [r[k] for r in runs if r.get(k) is not None]
        return round(sum(vals) / len(vals), 4) if vals else None
    first = runs[0]
    return {**{k: mean(k) for k in MEANS}, "seeds": [r["seed"] for r in runs], "run": first["run"],
            "series": first["series"], "host_load": {"loadavg_before": first["host_load"]["loadavg_before"],
                                                     "loadavg_after": runs[-1]["host_load"]["loadavg_after"]},
            "samples_lost": sum(r["samples_lost"] for r in runs), "per_seed": runs}


def write_readme(res: dict, path: Path) -> None:
    """A short Markdown summary beside omni_results.json (kept with the reference results)."""
    lines = ["# Omni study (relax study omni)", "",
             f"Config {res['config']} {' '.join(res['overrides'])}; runs one after the other on a "
             f"{os.cpu_count()}-core CPU.", "",
             "| mode | seed | run | step time (s) | training reward first -> last quarter | held-out greedy before -> "
             "after RL | 1-min load before -> after |", "|---|---|---|---|---|---|---|"]
    for mode, m in res["modes"].items():
        for r in m["per_seed"]:
            h = r["host_load"]
            lines.append(f"| {mode} | {r['seed']} | {r['run']} | {r['mean_step_time_s']} | {r['reward_start']} -> "
                         f"{r['reward_end']} | {r['eval_accuracy_start']} -> {r['eval_accuracy_end']} | "
                         f"{h['loadavg_before'][0]} -> {h['loadavg_after'][0]} |")
    lines += ["", f"async speed-up vs colocate: {res['speedup_async_vs_colocate']}x (published "
              f"{res['published']['speedup_async_vs_colocate']:.2f}x, Qwen3-Omni-30B-A3B, 16 GPUs). A load above the "
              "core count means other work shared the cores while a run was timed."]
    path.write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="experiments/omni/cpu.yaml")
    p.add_argument("--steps", type=int, default=None, help="RL steps of each run (default: the config's)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="seeds, each with its own warm-up and both modes (default: the config's seed)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides (both modes)")


def main(a: argparse.Namespace) -> int:
    from relax.models.warmup import warmup_state

    cfg = load_config(a.config, a.overrides)
    seeds = a.seeds if a.seeds is not None else [cfg.seed]
    t0 = time.time()
    for seed in seeds:  # cached: both runs of a seed (and their roles) start from these weights
        warmup_state(load_config(a.config, [*a.overrides, f"seed={seed}"]), progress=False)
    warm_s = time.time() - t0
    res: dict = {"config": a.config, "overrides": a.overrides, "model": cfg.model.model_dump(),
                 "task": cfg.task.model_dump(), "seeds": seeds,
                 "warmup": {**cfg.warmup.model_dump(), "seconds": round(warm_s, 1)},
                 "environment": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "machine": platform.machine(),
                                 "note": "2-core CPU, no GPU; the runs are one after the other on the same machine"},
                 "published": {"speedup_async_vs_colocate": published.value("omni_modes", "relax", "async_off_policy",
                                                                            "speedup_vs_colocate"),
                               "reward_start": published.value("omni_convergence", "relax", "async", "reward_start"),
                               "reward_end": published.value("omni_convergence", "relax", "async", "reward_end"),
                               "model": "Qwen3-Omni-30B-A3B", "hardware": "16 GPUs",
                               "source": f"{published.PAPER} (results/published/relax_paper.csv)"},
                 "modes": {}}
    path = a.out / cfg.name / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for seed in seeds:  # seed by seed, both modes of a seed back to back (the same load, as far as it goes)
        for mode in MODES:
            print(f"omni study: {mode}, seed {seed} ...", flush=True)
            m = run_mode(a.config, mode, a.out, a.steps, a.overrides, seed)
            runs[mode].append(m)
            res["modes"][mode] = mode_summary(runs[mode])
            print(f"    {m['mean_step_time_s']:.3f} s/step, reward {m['reward_start']:.3f} -> {m['reward_end']:.3f}, "
                  f"held-out greedy {m['eval_accuracy_start']} -> {m['eval_accuracy_end']}, "
                  f"load {m['host_load']['loadavg_before'][0]} -> {m['host_load']['loadavg_after'][0]}", flush=True)
            path.write_text(json.dumps(res, indent=1))
    am, cm = res["modes"]["async"], res["modes"]["colocate"]
    res["speedup_async_vs_colocate"] = round(cm["mean_step_time_s"] / am["mean_step_time_s"], 3)
    res["reward_rises"] = {m: v["reward_end"] > v["reward_start"] for m, v in res["modes"].items()}
    path.write_text(json.dumps(res, indent=1))
    write_readme(res, path.parent / "README.md")
    print(json.dumps({k: res[k] for k in ("speedup_async_vs_colocate", "reward_rises")}), flush=True)
    return 0
