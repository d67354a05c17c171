"""The omni study: async against colocate on the omni task, through the engine (Ray roles + bus).

    relax study omni [--config experiments/omni/cpu.yaml] [--steps N] [--out results] [k=v ...]

One supervised warm-up (cached), then one `relax run` per mode (experiments/launch.py), one after the other on
the same machine: async (off-policy, the config's max_staleness) and colocate (`mode=colocate`, staleness 0,
the rollout engine asleep while the Actor trains). Writes the two runs under OUT/omni/cpu/ and
OUT/omni/omni_results.json: per mode the step time, wall time, training reward (mean of the first and of the
last quarter of the steps) and the reward-per-step series, held-out accuracy before/after, the host load
around each run; and the async/colocate step-time ratio beside the published one (Qwen3-Omni-30B-A3B, 16 GPUs)
and the published reward start and end (analysis/published.py). `analysis.omni.draw_omni` turns it into
results/tables/omni.{md,csv} and results/figures/omni.png.
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


def run_mode(config: str, mode: str, out: Path, steps: int | None, overrides: list[str]) -> dict:
    name = f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = load_config(config, [*overrides, f"mode={mode}"])
    run_dir, summary = launch.run(config, [*overrides, f"mode={mode}"], out=out, run=name, steps=steps)
    run = RunFolder(run_dir)
    host = run.host_load()
    rows = run.metrics()
    rewards = [r["reward_mean"] for r in rows]
    start, end = quarter_means(rewards)
    return {
        "run": str(run_dir.relative_to(out)), "mode": mode, "max_staleness": cfg.max_staleness,
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


def write_readme(res: dict, path: Path) -> None:
    """A short Markdown summary beside omni_results.json (kept with the reference results)."""
    lines = ["# Omni study (relax study omni)", "",
             f"Config {res['config']} {' '.join(res['overrides'])}; runs one after the other on a "
             f"{os.cpu_count()}-core CPU.", "",
             "| mode | run | step time (s) | training reward first -> last quarter | 1-min load before -> after |",
             "|---|---|---|---|---|"]
    for mode, m in res["modes"].items():
        h = m["host_load"]
        lines.append(f"| {mode} | {m['run']} | {m['mean_step_time_s']} | {m['reward_start']} -> {m['reward_end']} | "
                     f"{h['loadavg_before'][0]} -> {h['loadavg_after'][0]} |")
    lines += ["", f"async speed-up vs colocate: {res['speedup_async_vs_colocate']}x (published "
              f"{res['published']['speedup_async_vs_colocate']:.2f}x, Qwen3-Omni-30B-A3B, 16 GPUs). A load above the "
              "core count means other work shared the cores while a run was timed."]
    path.write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="experiments/omni/cpu.yaml")
    p.add_argument("--steps", type=int, default=None, help="RL steps of each run (default: the config's)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides (both modes)")


def main(a: argparse.Namespace) -> int:
    from relax.models.warmup import warmup_state

    cfg = load_config(a.config, a.overrides)
    t0 = time.time()
    warmup_state(cfg, progress=False)  # cached: both runs (and their roles) start from these weights
    warm_s = time.time() - t0
    res: dict = {"config": a.config, "overrides": a.overrides, "model": cfg.model.model_dump(),
                 "task": cfg.task.model_dump(), "warmup": {**cfg.warmup.model_dump(), "seconds": round(warm_s, 1)},
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
    for mode in MODES:
        print(f"omni study: {mode} ...", flush=True)
        res["modes"][mode] = run_mode(a.config, mode, a.out, a.steps, a.overrides)
        m = res["modes"][mode]
        print(f"    {m['mean_step_time_s']:.3f} s/step, reward {m['reward_start']:.3f} -> {m['reward_end']:.3f}, "
              f"load {m['host_load']['loadavg_before'][0]} -> {m['host_load']['loadavg_after'][0]}", flush=True)
        path.write_text(json.dumps(res, indent=1))
    am, cm = res["modes"]["async"], res["modes"]["colocate"]
    res["speedup_async_vs_colocate"] = round(cm["mean_step_time_s"] / am["mean_step_time_s"], 3)
    res["reward_rises"] = {m: v["reward_end"] > v["reward_start"] for m, v in res["modes"].items()}
    path.write_text(json.dumps(res, indent=1))
    write_readme(res, path.parent / "README.md")
    print(json.dumps({k: res[k] for k in ("speedup_async_vs_colocate", "reward_rises")}), flush=True)
    return 0
