"""The head-room benchmark's table (the study: experiments/headroom/study.py, `relax study headroom`, writing
`<out>/headroom/headroom.json` beside its runs).

`write_headroom(results_root, tables_dir)` writes `headroom.{md,csv}`: one row per run (seed) and, per variant,
the mean held-out greedy-accuracy gain (after RL minus the warm-up start, on the run's eval prompts, which RL
never trained on) with its 95% Student-t interval over the seeds, the training seconds and the 1-minute host
load at the run's start. `draw_headroom(results_root, figures_dir, tables_dir)` writes that table and
`headroom.png`: per variant, the training reward (each seed faint, 8-step mean bold) against the run's wall time,
and the held-out gain with its interval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from analysis.plot import save  # noqa: E402
from analysis.tables import write_table

RESULTS_FILE = "headroom.json"
COLUMNS = ["variant", "seed", "steps", "eval_size", "accuracy_start", "accuracy_end", "gain", "gain_ci95",
           "train_time_s", "tokens_per_s", "load_1min"]
NOTE = ("Measured: tiny Qwen3 (char tokenizer) warm-started by a short SFT, then RL (experiments/headroom/cpu.yaml), "
        "on a 2-core CPU shared with other jobs (1-minute load average at each run's start in the table: above 2 the "
        "cores were over-subscribed and training seconds are inflated by it). Accuracy: greedy, on the eval split's "
        "prompts, which no warm-up or RL step saw. Gain: accuracy after RL minus at the warm-up start; the variant "
        "rows give the mean over seeds with a 95% Student-t interval (mean +- t(0.975, n-1) * sd / sqrt(n)). "
        "No published counterpart.")


def interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95% Student-t interval; None for fewer than 2 values)."""
    from scipy.stats import t

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def headroom_rows(results: dict) -> list[dict]:
    by_variant: dict[str, list[dict]] = {}
    for r in results.get("runs", {}).values():
        by_variant.setdefault(r["variant"], []).append(r)
    rows = []
    for name, runs in by_variant.items():
        runs.sort(key=lambda r: r["seed"])
        for r in runs:
            rows.append({"variant": name, "seed": r["seed"], "steps": r["steps"], "eval_size": r["eval_size"],
                         "accuracy_start": round(r["eval_accuracy_start"], 4),
                         "accuracy_end": round(r["eval_accuracy_end"], 4),
                         "gain": round(r["eval_accuracy_end"] - r["eval_accuracy_start"], 4), "gain_ci95": None,
                         "train_time_s": round(r["train_time_s"]), "tokens_per_s": round(r["tokens_per_s"], 1),
                         "load_1min": (r.get("load_before") or [None])[0]})
        mean, half = interval([r["eval_accuracy_end"] - r["eval_accuracy_start"] for r in runs])
        mean_of = lambda k: round(sum(r[k] for r in runs) / len(runs), 4)  # noqa: E731
        rows.append({"variant": f"**{name}: mean of {len(runs)}**", "seed": None, "steps": None, "eval_size": None,
                     "accuracy_start": mean_of("eval_accuracy_start"), "accuracy_end": mean_of("eval_accuracy_end"),
                     "gain": round(mean, 4), "gain_ci95": None if half is None else f"+-{half:.4f}",
                     "train_time_s": round(sum(r["train_time_s"] for r in runs) / len(runs)), "tokens_per_s": None,
                     "load_1min": None})
    return rows


def write_headroom(results_root: Path, tables_dir: Path) -> list[Path]:
    path = Path(results_root) / "headroom" / RESULTS_FILE
    if not path.exists():
        return []
    rows = headroom_rows(json.loads(path.read_text()))
    if not rows:
        return []
    return write_table(rows, tables_dir, "headroom", "Head-room benchmark: held-out greedy accuracy gain from RL "
                       "(CPU scale, seeds)", NOTE, COLUMNS)


SMOOTH = 8


def draw_headroom(results_root: Path, figures_dir: Path, tables_dir: Path) -> list[Path]:
    """The table (`write_headroom`) and headroom.png: reward against wall time and the gain per variant."""
    written = write_headroom(results_root, tables_dir)
    path = Path(results_root) / "headroom" / RESULTS_FILE
    if not written:
        return written
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from relax.run_folder import RunFolder

    results = json.loads(path.read_text())
    by_variant: dict[str, list[dict]] = {}
    for r in results["runs"].values():
        by_variant.setdefault(r["variant"], []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1.6, 1]})
    colors = plt.get_cmap("tab20")
    names = list(by_variant)
    for i, name in enumerate(names):
        for j, r in enumerate(sorted(by_variant[name], key=lambda r: r["seed"])):
            folder = RunFolder(path.parent / r["run"])
            try:
                m = pd.DataFrame(folder.metrics())
            except FileNotFoundError:
                continue
            t = m["wall_time_s"] if "wall_time_s" in m else m["step"]
            axes[0].plot(t, m["reward_mean"], color=colors(i % 20), alpha=0.2, lw=0.7)
            axes[0].plot(t, m["reward_mean"].rolling(SMOOTH, min_periods=1).mean(), color=colors(i % 20), lw=1.5,
                         label=name if j == 0 else None)
    axes[0].set(title=f"Training reward against wall time (per seed; raw faint, {SMOOTH}-step mean bold)",
                xlabel="wall time since the run's first step (s)", ylabel="mean reward of the step's samples")
    axes[0].legend(fontsize=7, ncol=2)
    gains = [interval([r["eval_accuracy_end"] - r["eval_accuracy_start"] for r in by_variant[n]]) for n in names]
    axes[1].barh(range(len(names)), [g[0] for g in gains], xerr=[g[1] or 0 for g in gains],
                 color=[colors(i % 20) for i in range(len(names))], capsize=3)
    axes[1].set_yticks(range(len(names)), names, fontsize=8)
    axes[1].axvline(0, color="k", lw=0.6)
    axes[1].set_title("Held-out greedy accuracy gain\n(mean, 95% interval over seeds)", fontsize=10)
    axes[1].set_xlabel("accuracy after RL - before")
    fig.tight_layout()
    figures_dir.mkdir(parents=True, exist_ok=True)
    out = figures_dir / "headroom.png"
    save(fig, out)
    return [*written, out, *draw_convergence(by_variant, path.parent, figures_dir, tables_dir)]


CONVERGENCE_COLUMNS = ["variant", "seeds", "accuracy_end", "accuracy_end_ci95", "overlaps_first", "gain",
                       "gain_ci95", "train_time_s", "tokens_per_s"]
CONVERGENCE_NOTE = ("Measured, CPU scale (see headroom.md for the set-up and each run's load). The paper's claim: every "
                    "mode converges to the same accuracy, the asynchronous ones in less wall time. accuracy_end: "
                    "held-out greedy accuracy after RL, mean over seeds with its 95% Student-t interval; "
                    "overlaps_first: whether that interval overlaps the first variant's (colocate). A run's wall "
                    "time depends on what ran beside it: headroom.md gives each run's host load, and headroom.json "
                    "marks the runs of `--parallel` (a variant's seeds at the same time) with parallel: true.")


MODE_KEYS = ("mode=", "max_staleness=")


def _mode_only(runs: list[dict]) -> bool:
    """Whether a variant is the base algorithm under some mode: its overrides (none for the base config) change
    only `mode` and `max_staleness`, so an algorithm row (rloo, gspo, ...) stays out of the mode comparison."""
    return all(o.startswith(MODE_KEYS) for r in runs for o in r.get("overrides", []))


def convergence_rows(by_variant: dict[str, list[dict]]) -> list[dict]:
    """Per mode variant (`_mode_only`) with an eval curve: end accuracy and gain with 95% intervals, and whether the
    end accuracy's interval overlaps the first variant's."""
    rows, first = [], None
    for name, runs in by_variant.items():
        if not any(r.get("eval_curve") for r in runs) or not _mode_only(runs):
            continue
        m, h = interval([r["eval_accuracy_end"] for r in runs])
        g, gh = interval([r["eval_accuracy_end"] - r["eval_accuracy_start"] for r in runs])
        lo, hi = m - (h or 0), m + (h or 0)
        first = first or (lo, hi)
        rows.append({"variant": name, "seeds": len(runs), "accuracy_end": round(m, 4),
                     "accuracy_end_ci95": None if h is None else f"+-{h:.4f}",
                     "overlaps_first": "yes" if lo <= first[1] and first[0] <= hi else "no",
                     "gain": round(g, 4), "gain_ci95": None if gh is None else f"+-{gh:.4f}",
                     "train_time_s": round(sum(r["train_time_s"] for r in runs) / len(runs)),
                     "tokens_per_s": round(sum(r["tokens_per_s"] for r in runs) / len(runs), 1)})
    return rows


def draw_convergence(by_variant: dict[str, list[dict]], root: Path, figures_dir: Path, tables_dir: Path) -> list[Path]:
    """headroom-convergence.{md,csv,png} for the variants whose runs kept an eval curve (task.eval_every): reward
    and held-out greedy accuracy, each against step and against wall time, every seed drawn."""
    rows = convergence_rows(by_variant)
    if not rows:
        return []
    import matplotlib.pyplot as plt
    import pandas as pd

    from relax.run_folder import RunFolder

    written = write_table(rows, tables_dir, "headroom-convergence", "Head-room benchmark: does every mode reach the "
                          "same held-out accuracy? (CPU scale, seeds)", CONVERGENCE_NOTE, CONVERGENCE_COLUMNS)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), sharey="row")
    colors = plt.get_cmap("tab10")
    for i, row in enumerate(rows):
        for j, r in enumerate(sorted(by_variant[row["variant"]], key=lambda r: r["seed"])):
            label = row["variant"] if j == 0 else None
            try:
                m = pd.DataFrame(RunFolder(root / r["run"]).metrics())
                smooth = m["reward_mean"].rolling(SMOOTH, min_periods=1).mean()
                axes[0, 0].plot(m["step"] + 1, smooth, color=colors(i % 10), lw=1, label=label)
                axes[0, 1].plot(m["wall_time_s"], smooth, color=colors(i % 10), lw=1, label=label)
            except FileNotFoundError:
                pass
            c = r.get("eval_curve") or []
            axes[1, 0].plot([p["version"] for p in c], [p["accuracy"] for p in c], "o-", ms=3, color=colors(i % 10),
                            lw=1, label=label)
            axes[1, 1].plot([p["wall_time_s"] for p in c], [p["accuracy"] for p in c], "o-", ms=3,
                            color=colors(i % 10), lw=1, label=label)
    axes[0, 0].set(title=f"Training reward ({SMOOTH}-step mean), each seed", ylabel="reward")
    axes[1, 0].set(title="Held-out greedy accuracy, each seed", xlabel="training steps", ylabel="accuracy")
    axes[0, 1].set(title="... against wall time")
    axes[1, 1].set(title="... against wall time", xlabel="wall time since the run's first step (s)")
    axes[1, 0].legend(fontsize=8)
    fig.suptitle("MEASURED at CPU scale: GRPO under each mode on the head-room benchmark", fontsize=11)
    fig.tight_layout()
    out = figures_dir / "headroom-convergence.png"
    save(fig, out)
    return [*written, out]
