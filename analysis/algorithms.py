"""The algorithm-comparison study's table and figure (the study itself: experiments/algorithms/study.py,
`relax study algorithms`, writing `<out>/algorithms/algorithms.json` beside its runs).

`draw_algorithms(results_root, figures_dir, tables_dir)` draws `algorithms.png` (training reward against step,
raw and smoothed, per algorithm; held-out eval before and after RL) and `algorithms.{md,csv}`.

Reward start/end: the mean training reward of the first START_STEPS steps (rollouts of the warm-up weights and
the first updates) and of the last END_STEPS steps, on the 16-prompt RL pool. Held-out (prompts RL never saw): summary.json's eval_reward_* (sampled at the
rollout temperature, 4 per prompt) and eval_accuracy_* (greedy), on the task's eval split.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.plot import save  # noqa: E402
from analysis.tables import write_table
from relax.run_folder import METRICS, RunFolder

COLORS = {"grpo": "#d62728", "gspo": "#1f77b4", "sapo": "#2ca02c", "opd": "#9467bd", "ppo_critic": "#ff7f0e"}
RESULTS_FILE = "algorithms.json"
START_STEPS, END_STEPS, SMOOTH = 4, 10, 8


def reward_window(rewards: list[float]) -> tuple[float, float]:
    """(mean of the first START_STEPS, mean of the last END_STEPS) training rewards."""
    head, tail = rewards[:START_STEPS], rewards[-END_STEPS:]
    return sum(head) / len(head), sum(tail) / len(tail)


# --- drawing -------------------------------------------------------------------------------------------------
NOTE = ("Measured: tiny Qwen3 (char tokenizer, SFT warm-up) on 1-digit +/- arithmetic, relax async off-policy "
        "(experiments/async/cpu.yaml; RL on a pool of 16 training prompts, learning rate 1e-4), one run per algorithm from the same warm-up weights and seed, on a 2-core "
        "CPU shared with other jobs (1-min load average per run in the table). Training reward is the mean of each "
        "step's {rows} samples on the 16-prompt RL pool (first {s} vs last {e} steps); held-out: {n} eval prompts, sampled at temperature 1 "
        "(4 each) and greedy, on prompts RL never saw: 30 steps on 16 prompts can over-fit the pool, and where the held-out numbers fall while the training reward rises, that is what happened. One seed each: differences of a few points are within run-to-run noise. The paper "
        "publishes no CPU-scale algorithm comparison, so there is no published column.")


def algorithm_rows(results: dict) -> list[dict]:
    rows = []
    for name, r in results.get("algorithms", {}).items():
        rows.append({
            "algorithm": name, "overrides": " ".join(r["overrides"]) or "(none)", "steps": r["steps"],
            "reward_start": r["reward_start"], "reward_end": r["reward_end"],
            "reward_gain": round(r["reward_end"] - r["reward_start"], 4),
            "eval_reward_start": round(r["eval_reward_start"], 4), "eval_reward_end": round(r["eval_reward_end"], 4),
            "eval_accuracy_start": round(r["eval_accuracy_start"], 4),
            "eval_accuracy_end": round(r["eval_accuracy_end"], 4),
            "step_time_s": r["mean_step_time_s"], "load_1min": (r.get("load_before") or ["?"])[0],
        })
    return rows


def draw_algorithms(results_root: Path, figures_dir: Path, tables_dir: Path) -> list[Path]:
    path = Path(results_root) / "algorithms" / RESULTS_FILE
    if not path.exists():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    results = json.loads(path.read_text())
    algs = results.get("algorithms", {})
    if not algs:
        return []
    root = path.parent
    rows = algorithm_rows(results)
    df = pd.DataFrame(rows)
    eval_n, rows_per_step = None, None
    written = []
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    for name, r in algs.items():
        cfg = RunFolder(root / r["run"]).config()
        if eval_n is None and cfg:
            eval_n, rows_per_step = cfg["task"]["eval_size"], cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"]
    note = NOTE.format(s=START_STEPS, e=END_STEPS, n=eval_n or "the", rows=rows_per_step or "")
    written += write_table(df, tables_dir, "algorithms", "Algorithm comparison (CPU scale, one run each)", note)

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    for name, r in algs.items():
        run = RunFolder(root / r["run"])
        if not (run / METRICS).exists():
            continue
        m = pd.DataFrame(run.metrics())
        color = COLORS.get(name)
        axes[0].plot(m["step"], m["reward_mean"], color=color, alpha=0.25, lw=0.8)
        axes[0].plot(m["step"], m["reward_mean"].rolling(SMOOTH, min_periods=1).mean(), color=color, lw=1.8,
                     label=f"{name}: {r['reward_start']:.2f} -> {r['reward_end']:.2f}")
    axes[0].set(title="Training reward per step (raw faint, %d-step mean bold)" % SMOOTH, xlabel="training step",
                ylabel="mean reward of the step's samples")
    axes[0].legend(fontsize=8, title=f"reward first {START_STEPS} -> last {END_STEPS} steps", title_fontsize=8)
    axes[0].grid(alpha=0.3)
    x = range(len(df))
    w = 0.2
    for i, (col, label, hatch) in enumerate([("eval_reward_start", "sampled reward, warm-up", "//"),
                                              ("eval_reward_end", "sampled reward, after RL", ""),
                                              ("eval_accuracy_start", "greedy accuracy, warm-up", "//"),
                                              ("eval_accuracy_end", "greedy accuracy, after RL", "")]):
        axes[1].bar([j + (i - 1.5) * w for j in x], df[col], w, label=label, hatch=hatch,
                    color=["#9ecae1", "#3182bd", "#fdae6b", "#e6550d"][i], edgecolor="black", lw=0.4)
    axes[1].set_xticks(list(x), df["algorithm"], fontsize=8)
    lo = min(df[["eval_reward_start", "eval_reward_end"]].min()) - 0.1
    axes[1].set(title=f"Held-out eval ({eval_n or '?'} prompts): before vs after RL", ylim=(max(0, lo), 1.15))
    axes[1].legend(fontsize=7, loc="upper left", ncol=2)
    axes[1].grid(alpha=0.3, axis="y")
    fig.text(0.01, 0.01, "Measured at CPU scale (2-core CPU, tiny model); training reward on a 16-prompt RL pool, held-out on "
             "unseen prompts; no published counterpart.", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    out = figures_dir / "algorithms.png"
    save(fig, out)
    return written + [out]

