"""Figures and tables from run results, beside the paper's published numbers.

`python -m analysis.figures [--source DIR]` reads the newest run of each experiment/profile under DIR
(default: results/, falling back to results/reference/ when no fresh runs exist) and writes PNGs to
results/figures/ and Markdown + CSV tables to results/tables/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.results import RESULTS, latest_runs, load_metrics, load_summary, published_value  # noqa: E402

# The three text-mode runs of the paper's modes table, by (experiment, profile).
MODES = {
    "colocate": ("colocate", "cpu"),
    "async_on_policy": ("async", "cpu-onpolicy"),
    "async_off_policy": ("async", "cpu"),
}
LABELS = {"colocate": "colocate", "async_on_policy": "async on-policy", "async_off_policy": "async off-policy"}
COLORS = {"colocate": "#7f7f7f", "async_on_policy": "#1f77b4", "async_off_policy": "#d62728"}


def modes_table(runs: dict) -> pd.DataFrame:
    rows = []
    base = None
    for mode, key in MODES.items():
        if key not in runs:
            continue
        s = load_summary(runs[key])
        if mode == "colocate":
            base = s["mean_step_time_s"]
        rows.append({
            "mode": mode, "run": str(runs[key].relative_to(runs[key].parents[3])),
            "step_time_s": s["mean_step_time_s"], "steps_per_hour": s["steps_per_hour"],
            "speedup_vs_colocate": round(base / s["mean_step_time_s"], 3) if base else None,
            "published_speedup": published_value("text_modes", "relax", mode, "speedup_vs_colocate")
            or (1.0 if mode == "colocate" else None),
            "published_step_time_s": published_value("text_modes", "relax", mode, "step_time"),
            "final_reward": round(s["final_reward"], 4), "pipeline_efficiency": s.get("pipeline_efficiency"),
            "trainer_wait_share": s.get("trainer_wait_share"), "peak_memory_mb": s.get("peak_memory_mb"),
            "hardware (measured)": s["environment"]["hardware"], "hardware (published)": "16xH800, Qwen3-4B",
        })
    return pd.DataFrame(rows)


def write_table(df: pd.DataFrame, out: Path, name: str, title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    (out / f"{name}.md").write_text(f"# {title}\n\n{df.to_markdown(index=False)}\n")


def plot_modes(table: pd.DataFrame, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    labels = [LABELS[m] for m in table["mode"]]
    colors = [COLORS[m] for m in table["mode"]]
    axes[0].bar(labels, table["step_time_s"], color=colors)
    axes[0].set(title="Mean step time (measured, CPU)", ylabel="seconds per step")
    axes[1].bar(labels, table["steps_per_hour"], color=colors)
    axes[1].set(title="Throughput (measured, CPU)", ylabel="steps per hour")
    x = range(len(table))
    axes[2].bar([i - 0.2 for i in x], table["speedup_vs_colocate"], width=0.4, label="measured (2-core CPU)",
                color=colors)
    axes[2].bar([i + 0.2 for i in x], table["published_speedup"].fillna(0), width=0.4, hatch="//",
                label="published (16xH800)", color="white", edgecolor="black")
    axes[2].set_xticks(list(x), labels)
    axes[2].set(title="Speed-up over colocate", ylabel="x")
    axes[2].axhline(1.0, color="black", lw=0.8)
    axes[2].legend()
    for ax in axes:
        ax.tick_params(axis="x", rotation=15)
    fig.tight_layout()
    fig.savefig(out / "modes_step_time.png", dpi=120)
    plt.close(fig)


def plot_reward(runs: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for mode, key in MODES.items():
        if key not in runs:
            continue
        df = load_metrics(runs[key])
        axes[0].plot(df["step"], df["reward_mean"], marker="o", ms=3, label=LABELS[mode], color=COLORS[mode])
        axes[1].plot(df["wall_time_s"], df["reward_mean"], marker="o", ms=3, label=LABELS[mode], color=COLORS[mode])
    axes[0].set(title="Reward against step", xlabel="training step", ylabel="mean reward of the step's samples")
    axes[1].set(title="Reward against wall time", xlabel="wall time (s)", ylabel="mean reward")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "modes_reward.png", dpi=120)
    plt.close(fig)


def draw_all(source: Path, dest: Path = RESULTS) -> list[Path]:
    runs = latest_runs(source)
    figs, tables = dest / "figures", dest / "tables"
    figs.mkdir(parents=True, exist_ok=True)
    table = modes_table(runs)
    if table.empty:
        raise SystemExit(f"no runs of the modes experiments under {source}")
    write_table(table, tables, "modes", "Step time by mode: measured (CPU scale) beside published (16xH800)")
    plot_modes(table, figs)
    plot_reward(runs, figs)
    return sorted(figs.glob("*.png"))


def default_source() -> Path:
    return RESULTS if latest_runs(RESULTS) else RESULTS / "reference"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--source", type=Path, default=None, help="results root to read (default: results/)")
    args = p.parse_args(argv)
    for path in draw_all(args.source or default_source()):
        print(path)


if __name__ == "__main__":
    main()
