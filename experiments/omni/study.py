"""The omni study: async against colocate on the omni task, through the engine (Ray roles + bus).

    python -m relax.omni.experiment [--config experiments/omni/cpu.yaml] [--steps N] [--out results] [k=v ...]

One supervised warm-up (cached), then one `relax run` per mode, one after the other on the same machine:
async (off-policy, the config's max_staleness) and colocate (`mode=colocate`, staleness 0, the rollout engine
asleep while the Actor trains). Writes the two runs under OUT/omni/cpu/ and OUT/omni/omni_results.json: per mode
the step time, wall time, training reward (mean of the first and of the last quarter of the steps) and the
reward-per-step series, held-out accuracy before/after, the host load average around each run; and the
async/colocate step-time ratio beside the published 2.00x (Qwen3-Omni-30B-A3B, 16 GPUs) and reward 0.72 -> 0.93.
`relax.omni.report.draw_omni` turns it into results/tables/omni.{md,csv} and results/figures/omni.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from relax.config import load_config

RESULTS_FILE = "omni_results.json"
MODES = ("async", "colocate")


def quarter_means(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def run_mode(config: str, mode: str, out: Path, steps: int | None, overrides: list[str]) -> dict:
    name = f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [sys.executable, "-m", "relax.cli", "run", config, *overrides, f"mode={mode}", "--out", str(out),
           "--run", name, "--no-progress", *(["--steps", str(steps)] if steps else [])]
    cfg = load_config(config, [*overrides, f"mode={mode}"])
    load_before = os.getloadavg()
    t0 = time.time()
    log = out / f".omni-{name}.log"
    with open(log, "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
            raise RuntimeError(f"omni {mode} run failed; see {log}")
    run_dir = out / cfg.name / cfg.profile / name
    host = {"loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "wall_s": round(time.time() - t0, 1)}
    (run_dir / "host_load.json").write_text(json.dumps(host))
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
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
    lines = ["# Omni study (python -m relax.omni.experiment)", "",
             f"Config {res['config']} {' '.join(res['overrides'])}; runs one after the other on a "
             f"{os.cpu_count()}-core CPU.", "",
             "| mode | run | step time (s) | training reward first -> last quarter | 1-min load before -> after |",
             "|---|---|---|---|---|"]
    for mode, m in res["modes"].items():
        h = m["host_load"]
        lines.append(f"| {mode} | {m['run']} | {m['mean_step_time_s']} | {m['reward_start']} -> {m['reward_end']} | "
                     f"{h['loadavg_before'][0]} -> {h['loadavg_after'][0]} |")
    lines += ["", f"async speed-up vs colocate: {res['speedup_async_vs_colocate']}x (published 2.00x, "
              "Qwen3-Omni-30B-A3B, 16 GPUs). A load above the core count means other work shared the cores while a "
              "run was timed."]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="experiments/omni/cpu.yaml")
    p.add_argument("--steps", type=int, default=None, help="RL steps of each run (default: the config's)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides (both modes)")
    a = p.parse_args(argv)
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
                 "published": {"speedup_async_vs_colocate": 2.00, "reward_start": 0.72, "reward_end": 0.93,
                               "model": "Qwen3-Omni-30B-A3B", "hardware": "16 GPUs",
                               "source": "arXiv 2604.11554 (results/published/relax_paper.csv)"},
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
    return res


if __name__ == "__main__":
    main()
