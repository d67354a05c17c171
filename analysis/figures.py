"""Figures and tables from run results, beside the paper's published numbers.

`relax figures [--source DIR] [--dest DIR]` (`make figures`) reads the newest run of each experiment/profile
under DIR (default: results/, falling back to results/reference/ when there are no fresh runs) and writes
PNGs to DEST/figures/ and Markdown + CSV tables to DEST/tables/ (DEST default: results/).

Systems: relax colocate / async on-policy / async off-policy (experiments/colocate/cpu.yaml,
experiments/async/cpu-onpolicy.yaml, experiments/async/cpu.yaml) and the veRL and OpenRLHF schedules
EMULATED in our engine (experiments/async/cpu-verl.yaml, cpu-openrlhf.yaml); the staleness sweep is every
relax async run of the `async` experiment, by max_staleness.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import critical_path  # noqa: E402
from analysis.plot import save  # noqa: E402
from analysis.published import value as published_value  # noqa: E402
from analysis.results import (  # noqa: E402
    PUBLISHED_HW, REFERENCE, RESULTS, SYSTEMS, hardware, host_load, load_config, load_metrics, load_summary,
    published_metric, staleness_runs, system_runs,
)
from analysis.tables import write_table  # noqa: E402
from relax.run_folder import latest_runs  # noqa: E402

PUB_LABEL = "published (16xH800)"
CPU_LABEL = "measured (2-core CPU)"


# --- tables ------------------------------------------------------------------------------------------------
def _r(x, nd=4):
    return None if x is None or pd.isna(x) else round(float(x), nd)


def systems_table(runs: dict[str, Path]) -> pd.DataFrame:
    rows = []
    for key, run in runs.items():
        s, sys = load_summary(run), SYSTEMS[key]
        rows.append({
            "system": sys.label, "emulated": sys.emulated, "run": "/".join(run.parts[-3:]),
            "step_time_s": s["mean_step_time_s"], "steps_per_hour": s["steps_per_hour"],
            "reward_start": _r(s["initial_reward"]), "reward_end": _r(s["final_reward"]),
            "eval_acc_start": _r(s.get("eval_accuracy_start")), "eval_acc_end": _r(s.get("eval_accuracy_end")),
            "max_staleness": s.get("max_staleness"), "staleness_max_seen": s.get("staleness_max"),
            "pipeline_efficiency": s.get("pipeline_efficiency"), "trainer_wait_share": s.get("trainer_wait_share"),
            "published_step_time_s": published_metric(key, "step_time"),
            "published_steps_per_hour": published_metric(key, "steps_per_hour"),
            "hardware (measured)": hardware(s, load_config(run)),
            "host load (1-min avg, before -> after)": host_load(run),
            "hardware (published)": f"{PUBLISHED_HW}, Qwen3-4B" if sys.published else "-",
        })
    return pd.DataFrame(rows)


RATIOS = [
    # (name, faster system, slower system, published metric row)
    ("relax async on-policy vs colocate", "async_on_policy", "colocate",
     ("text_modes", "relax", "async_on_policy", "speedup_vs_colocate")),
    ("relax async off-policy vs colocate", "async_off_policy", "colocate",
     ("text_modes", "relax", "async_off_policy", "speedup_vs_colocate")),
    ("relax async vs veRL", "async_off_policy", "verl", ("vs_verl", "relax", "async", "speedup_vs_verl")),
    ("relax async vs OpenRLHF", "async_off_policy", "openrlhf", None),
]


def ratios_table(runs: dict[str, Path]) -> pd.DataFrame:
    rows = []
    for name, fast, slow, pub in RATIOS:
        if fast not in runs or slow not in runs:
            continue
        sf, ss = load_summary(runs[fast]), load_summary(runs[slow])
        emulated = SYSTEMS[slow].emulated or SYSTEMS[fast].emulated
        rows.append({
            "speed-up": name + (" (emulated)" if emulated else ""),
            "measured, step time (x)": round(ss["mean_step_time_s"] / sf["mean_step_time_s"], 3),
            "measured, steps/hour (x)": round(sf["steps_per_hour"] / ss["steps_per_hour"], 3),
            "published (x)": published_value(*pub) if pub else None,
            "measured on": hardware(sf, load_config(runs[fast])),
            "published on": f"{PUBLISHED_HW}, Qwen3-4B" if pub else "-",
        })
    return pd.DataFrame(rows)


def modes_table(runs: dict[str, Path]) -> pd.DataFrame:
    """The paper's modes table: relax's three modes, step time and speed-up over colocate."""
    rows, base = [], None
    for key in ("colocate", "async_on_policy", "async_off_policy"):
        if key not in runs:
            continue
        s = load_summary(runs[key])
        if key == "colocate":
            base = s["mean_step_time_s"]
        rows.append({
            "mode": key, "step_time_s": s["mean_step_time_s"], "steps_per_hour": s["steps_per_hour"],
            "speedup_vs_colocate": round(base / s["mean_step_time_s"], 3) if base else None,
            "published_speedup": published_value("text_modes", "relax", key, "speedup_vs_colocate")
            or (1.0 if key == "colocate" else None),
            "published_step_time_s": published_value("text_modes", "relax", key, "step_time"),
            "hardware (measured)": hardware(s, load_config(runs[key])),
            "hardware (published)": f"{PUBLISHED_HW}, Qwen3-4B",
        })
    return pd.DataFrame(rows)


def staleness_table(runs: dict[int, Path]) -> pd.DataFrame:
    rows = []
    for s_max, run in runs.items():
        s = load_summary(run)
        m = load_metrics(run)
        rows.append({
            "max_staleness": s_max, "run": "/".join(run.parts[-3:]), "step_time_s": s["mean_step_time_s"],
            "steps_per_hour": s["steps_per_hour"], "staleness_mean_seen": round(float(m.staleness_mean.mean()), 3),
            "reward_start": _r(s["initial_reward"]), "reward_end": _r(s["final_reward"]),
            "eval_acc_end": _r(s.get("eval_accuracy_end")),
            "hardware (measured)": hardware(s, load_config(run)),
            "host load (1-min avg, before -> after)": host_load(run),
        })
    return pd.DataFrame(rows)


# --- figures -----------------------------------------------------------------------------------------------
def _label(key: str) -> str:
    return SYSTEMS[key].label


def plot_systems(table: pd.DataFrame, ratios: pd.DataFrame, runs: dict[str, Path], out: Path) -> Path:
    keys = list(runs)
    labels = [textwrap.fill(_label(k), 14) for k in keys]
    colors = [SYSTEMS[k].color for k in keys]
    hatches = ["xx" if SYSTEMS[k].emulated else None for k in keys]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, col, title, unit, pub_col in [
            (axes[0], "step_time_s", "Mean step time", "seconds per step", "published_step_time_s"),
            (axes[1], "steps_per_hour", "Throughput", "steps per hour", "published_steps_per_hour")]:
        ax.bar(labels, table[col], color=colors, hatch=hatches, edgecolor="black", linewidth=0.5)
        # The published value of each system under its bar's label (absolute times differ by orders of magnitude).
        ticks = [f"{lbl}\n{PUB_LABEL.split(' ')[0]}: {pub:g}" if pub is not None and not pd.isna(pub)
                 else f"{lbl}\n{PUB_LABEL.split(' ')[0]}: n/a" for lbl, pub in zip(labels, table[pub_col])]
        ax.set_xticks(range(len(labels)), ticks)
        ax.set(title=f"{title}, {CPU_LABEL}", ylabel=unit,
               xlabel=f"under each bar: the {PUB_LABEL} value ({'s' if col == 'step_time_s' else '1/h'})")
        ax.tick_params(axis="x", labelsize=7)
    ax = axes[2]
    if len(ratios):
        x = range(len(ratios))
        ax.bar([i - 0.2 for i in x], ratios["measured, step time (x)"], width=0.4, color="#d62728",
               label=CPU_LABEL)
        pub = ratios["published (x)"].astype(float)
        ax.bar([i + 0.2 for i in x], pub.fillna(0), width=0.4, hatch="//", color="white", edgecolor="black",
               label=PUB_LABEL)
        for i, (m, p) in enumerate(zip(ratios["measured, step time (x)"], pub)):
            ax.text(i - 0.2, m, f"{m:.2f}x", ha="center", va="bottom", fontsize=8)
            ax.text(i + 0.2, 0 if pd.isna(p) else p, "n/a" if pd.isna(p) else f"{p:.2f}x", ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(list(x), [n.replace("relax async ", "async ").replace(" vs ", "\nvs ")
                                for n in ratios["speed-up"]], fontsize=7)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.legend(fontsize=8)
    ax.set(title="Speed-up (ratio of step times)", ylabel="x")
    ax.margins(y=0.2)
    fig.suptitle("Step time by mode and system: relax modes, veRL and OpenRLHF schedules emulated at CPU scale",
                 fontsize=11)
    fig.tight_layout()
    path = out / "systems_step_time.png"
    save(fig, path)
    return path


def plot_reward(runs: dict[str, Path], out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for key, run in runs.items():
        df = load_metrics(run)
        sys = SYSTEMS[key]
        style = dict(color=sys.color, ls="--" if sys.emulated else "-", lw=1.6)
        smooth = df["reward_mean"].rolling(5, min_periods=1).mean()
        for ax, x in ((axes[0], df["step"]), (axes[1], df["wall_time_s"])):
            ax.plot(x, df["reward_mean"], color=sys.color, alpha=0.25, lw=0.8)
            ax.plot(x, smooth, label=sys.label, **style)
    axes[0].set(title="Reward against training step", xlabel="training step",
                ylabel="mean reward of the step's samples")
    axes[1].set(title="Reward against wall time (same reward, less time)",
                xlabel="wall time since training started (s)", ylabel="mean reward")
    for ax in axes:
        ax.legend(fontsize=8, title=f"{CPU_LABEL}; 5-step mean, raw faint", title_fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "reward_curves.png"
    save(fig, path)
    return path


def plot_staleness(table: pd.DataFrame, out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    s = table["max_staleness"]
    axes[0].plot(s, table["steps_per_hour"], marker="o", color="#d62728", label="steps per hour")
    axes[0].set(title=f"Throughput against max_staleness, {CPU_LABEL}", xlabel="max_staleness s",
                ylabel="steps per hour")
    ax2 = axes[0].twinx()
    ax2.plot(s, table["step_time_s"], marker="s", ls="--", color="#7f7f7f", label="mean step time")
    ax2.set_ylabel("seconds per step")
    h1, l1 = axes[0].get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    axes[0].legend(h1 + h2, l1 + l2, fontsize=8)
    axes[1].plot(s, table["reward_end"], marker="o", color="#1f77b4", label="final reward (last quarter of steps)")
    axes[1].plot(s, table["eval_acc_end"], marker="s", color="#2ca02c", label="held-out greedy accuracy after RL")
    axes[1].set(title="Final reward against max_staleness (no published sweep)", xlabel="max_staleness s",
                ylabel="reward / accuracy")
    ax3 = axes[1].twinx()
    ax3.plot(s, table["staleness_mean_seen"], marker="^", ls=":", color="#7f7f7f",
             label="mean staleness of trained samples")
    ax3.set_ylabel("weight versions behind")
    h1, l1 = axes[1].get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    axes[1].legend(h1 + h2, l1 + l2, fontsize=8)
    for ax in axes:
        ax.set_xticks(list(s))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "staleness_sweep.png"
    save(fig, path)
    return path


# --- entry point -------------------------------------------------------------------------------------------
HW_NOTE = ("Measured: this repository's CPU-scale runs (2-core CPU, no GPU, tiny models); veRL and OpenRLHF are "
           "their schedules EMULATED in our engine with our kernels, not those frameworks. Published: the Relax "
           "paper (arXiv 2604.11554), 16xH800, Qwen3-4B. Compare ratios, not absolute times.")


def _draw_r3(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.r3_moe import draw_r3

    return draw_r3(source, figs, tables)


def _draw_omni(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.omni import draw_omni

    return draw_omni(source, figs, tables)


def _draw_recovery(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.recovery import draw_recovery

    return draw_recovery(source, figs, tables)


def _draw_sim(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.sim import draw_sim

    return draw_sim(source, figs, tables)


def _draw_emulate(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.emulate import draw_emulate

    return draw_emulate(source, figs, tables)


# Drawers of the studies in analysis.reproduce.STUDIES: (results root, figures dir, tables dir) -> files written;
# each draws nothing when its study has no results under the root.
def _draw_headroom(source: Path, figs: Path, tables: Path) -> list[Path]:
    from analysis.headroom import draw_headroom

    return draw_headroom(source, figs, tables)


STUDIES = [_draw_r3, _draw_omni, _draw_recovery, _draw_sim, _draw_emulate, _draw_headroom]


def draw_all(source: Path, dest: Path = RESULTS, only: list[Path] | None = None) -> list[Path]:
    """Every figure and table that the runs under `source` (only those in `only`, when given) and the studies
    under it allow; returns the files written."""
    figs, tables = dest / "figures", dest / "tables"
    figs.mkdir(parents=True, exist_ok=True)
    written: list[Path] = [f for draw in STUDIES for f in draw(source, figs, tables)]
    runs = system_runs(source, only)
    if not runs:
        if written:
            return written
        raise SystemExit(f"no runs of the compared systems under {source} (expected e.g. async/cpu/<run>/)")
    systems, ratios = systems_table(runs), ratios_table(runs)
    written += write_table(systems, tables, "systems", "Step time and throughput by mode and system", HW_NOTE)
    written += write_table(ratios, tables, "ratios", "Speed-ups: measured at CPU scale beside published", HW_NOTE)
    modes = modes_table(runs)
    if len(modes):
        written += write_table(modes, tables, "modes", "The paper's modes table: measured beside published", HW_NOTE)
    written.append(plot_systems(systems, ratios, runs, figs))
    written.append(plot_reward(runs, figs))
    traced = {k: r for k, r in runs.items() if (r / "trace.json").exists()}
    if traced:
        cp = critical_path.critical_path_table(traced)
        written += write_table(cp, tables, "critical_path", "Critical path of a step: mean seconds per steady step "
                               "on the trainer's path, measured beside published", HW_NOTE)
        written.append(critical_path.plot_gantt(traced, figs))
        written.append(critical_path.plot_breakdown(cp, figs))
    sweep = staleness_runs(source, only)
    if len(sweep) >= 2:
        st = staleness_table(sweep)
        written += write_table(st, tables, "staleness", "Staleness sweep (relax async, CPU scale)", HW_NOTE)
        written.append(plot_staleness(st, figs))
    return written


def default_source() -> Path:
    return RESULTS if latest_runs(RESULTS) else REFERENCE


def main(args) -> int:
    source = args.source or default_source()
    print(f"reading runs under {source}")
    for path in draw_all(source, args.dest or RESULTS):
        print(path)
    return 0
