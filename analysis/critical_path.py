"""The critical path of a training step, from a run's trace.json.

A step's window runs from the end of the previous step to the end of this one (metrics.jsonl wall_time_s;
the trace uses the same clock). The trainer (Actor lane) is the critical path: what it does in the window,
by category (relax/schedules/spans.py), and the time no Actor span covers (waiting for data it has no span
for) add up to the step time. Waiting for rollout, a reference forward in the step, weight sync barriers:
each is a named slice of that sum.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis.plot import save  # noqa: E402
from analysis.published import value as published_value  # noqa: E402
from analysis.results import SYSTEMS, load_metrics, load_summary, load_trace, run_kind  # noqa: E402
from relax.metrics.telemetry import union_seconds  # noqa: E402
from relax.schedules import spans as S  # noqa: E402

LANES = ["rollout", "reward", "reference", "actor_fwd", "advantages", "actor"]
LANE_LABEL = {"actor": "actor (trainer)"}

# Gantt colours by span name (anything else: light grey).
SPAN_COLOR = {
    "generate": "#1f77b4", "weight_sync": "#9467bd", "sleep": "#bcbd22", "wake": "#bcbd22",
    "reward": "#17becf", "advantages": "#8c564b",
    "ref_log_probs": "#ff7f0e", "ref_forward": "#ff7f0e", "ref_forward_wait": "#ffbb78",
    "old_logprob": "#e377c2", "old_log_probs": "#e377c2",
    "train_micro_batch": "#d62728", "optimizer_step": "#8b0000",
    "weight_publish": "#9467bd", "weight_sync_barrier": "#c5b0d5", "broadcast_lock_wait": "#c5b0d5",
    "rollout_residual": "#f7b6d2", "trainer_wait": "#f7b6d2",
    "checkpoint": "#bbbbbb",
    "staleness_gate": "#dddddd", "queue_slot_wait": "#dddddd", "generation_lock_wait": "#dddddd",
}
CATEGORY_COLOR = {S.WAIT_ROLLOUT: "#f7b6d2", S.IDLE: "#fde0ef", S.REFERENCE: "#ff7f0e", S.OLD_LOGPROB: "#e377c2",
                  S.TRAIN: "#d62728", S.WEIGHT_SYNC: "#9467bd", S.OTHER: "#bbbbbb"}


def step_windows(metrics: pd.DataFrame) -> list[tuple[int, float, float]]:
    """(step, start, end) of every step, in seconds on the trace's clock."""
    out, prev = [], 0.0
    for step, end in zip(metrics["step"], metrics["wall_time_s"]):
        out.append((int(step), prev, float(end)))
        prev = float(end)
    return out


def breakdown(trace: pd.DataFrame, t0: float, t1: float) -> dict[str, float]:
    """Seconds of [t0, t1] the trainer spent in each category; IDLE is the time no trainer span covers."""
    lane = trace[(trace.role == S.TRAINER_LANE) & (trace.end > t0) & (trace.start < t1)]
    out = {c: 0.0 for c in S.CATEGORIES}
    clipped = []
    for name, lo, hi in zip(lane.name, lane.start.clip(lower=t0), lane.end.clip(upper=t1)):
        clipped.append((lo, hi))
        out[S.CATEGORY.get(name, S.OTHER)] += max(0.0, hi - lo)
    out[S.IDLE] = max(0.0, (t1 - t0) - union_seconds(clipped))
    return out


def step_breakdowns(run: Path) -> pd.DataFrame:
    """One row per step: step, step_time_s and the seconds of each category."""
    metrics, trace = load_metrics(run), load_trace(run)
    rows = []
    for step, t0, t1 in step_windows(metrics):
        rows.append({"step": step, "step_time_s": t1 - t0, **breakdown(trace, t0, t1)})
    return pd.DataFrame(rows)


def representative_step(run: Path) -> int:
    """A steady-state step (not the first, which fills the pipeline): the one closest to the median time."""
    m = load_metrics(run)
    steady = m[m.step > 0] if len(m) > 1 else m
    med = steady.step_time_s.median()
    return int(steady.iloc[(steady.step_time_s - med).abs().argsort().iloc[0]].step)


def critical_path_table(runs: dict[str, Path]) -> pd.DataFrame:
    """Mean seconds per steady step of each category on the trainer's path, per system, with the paper's."""
    rows = []
    for key, run in runs.items():
        df = step_breakdowns(run)
        steady = df[df.step > 0] if len(df) > 1 else df
        mean = steady.mean(numeric_only=True)
        row = {"system": SYSTEMS[key].label, "measured on": _measured_on(run),
               "step_time_s": round(mean.step_time_s, 4)}
        for c in S.CATEGORIES:
            row[f"{c} (s)"] = round(mean[c], 4)
        wait = mean[S.WAIT_ROLLOUT] + mean[S.IDLE]
        row["trainer wait share"] = round(wait / mean.step_time_s, 4) if mean.step_time_s else None
        row["reference share"] = round(mean[S.REFERENCE] / mean.step_time_s, 4) if mean.step_time_s else None
        rows.append(row)
    # The paper's critical-path figure (vs veRL, 16xH800): rollout residual and reference forward of veRL,
    # the trainer wait of Relax.
    v_step = published_value("vs_verl", "verl", "async", "step_time")
    v_res = published_value("vs_verl", "verl", "async", "critical_path_rollout_residual")
    v_ref = published_value("vs_verl", "verl", "async", "critical_path_reference_fwd")
    r_step = published_value("vs_verl", "relax", "async", "step_time")
    r_wait = published_value("vs_verl", "relax", "async", "trainer_wait_per_step")
    if v_step:
        rows.append({"system": "veRL, published (16xH800)", "measured on": "16xH800", "step_time_s": v_step,
                     f"{S.WAIT_ROLLOUT} (s)": v_res, f"{S.REFERENCE} (s)": v_ref,
                     "trainer wait share": round(v_res / v_step, 4), "reference share": round(v_ref / v_step, 4)})
    if r_step:
        rows.append({"system": "relax async, published (16xH800)", "measured on": "16xH800", "step_time_s": r_step,
                     f"{S.WAIT_ROLLOUT} (s)": r_wait, "trainer wait share": round(r_wait / r_step, 4)})
    return pd.DataFrame(rows)


def _measured_on(run: Path) -> str:
    """Where a run's trace comes from: this machine, or an EMULATED / SIMULATED cluster (its trace is then in
    that cluster's seconds, or real seconds under the stated compression)."""
    s = load_summary(run)
    kind, _ = run_kind(s)
    return s.get("environment", {}).get("hardware", "2-core CPU") if kind == "measured" else kind


def plot_gantt(runs: dict[str, Path], out: Path) -> Path:
    """One panel per system: a lane per role over one steady step, the trainer's waits and reference
    forward marked and summed in the panel title."""
    keys = list(runs)
    fig, axes = plt.subplots(len(keys), 1, figsize=(13, 1.9 + 1.75 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        run = runs[key]
        metrics, trace = load_metrics(run), load_trace(run)
        step = representative_step(run)
        _, t0, t1 = next(w for w in step_windows(metrics) if w[0] == step)
        pad = 0.08 * (t1 - t0)
        lo, hi = t0 - pad, t1 + pad
        lanes = [r for r in LANES if r in set(trace.role)] + sorted(set(trace.role) - set(LANES))
        for y, role in enumerate(lanes):
            sp = trace[(trace.role == role) & (trace.end > lo) & (trace.start < hi)]
            for name, s0, s1 in zip(sp.name, sp.start, sp.end):
                waiting = name in S.WAIT_SPANS
                ax.broken_barh([(max(s0, lo) - t0, min(s1, hi) - max(s0, lo))], (y - 0.38, 0.76),
                               facecolors=SPAN_COLOR.get(name, "#eeeeee"), edgecolor="black" if waiting else "none",
                               linewidth=0.4, hatch="//" if waiting else None)
        b = breakdown(trace, t0, t1)
        wait = b[S.WAIT_ROLLOUT] + b[S.IDLE]
        title = (f"{SYSTEMS[key].label} ({_measured_on(run)}): step {step}, {t1 - t0:.2f} s"
                 f"  |  trainer wait {wait:.2f} s"
                 f"  |  reference forward on path {b[S.REFERENCE]:.2f} s  |  weight sync {b[S.WEIGHT_SYNC]:.2f} s")
        ax.set_title(title, fontsize=9, loc="left")
        ax.axvline(0, color="black", lw=0.8)
        ax.axvline(t1 - t0, color="black", lw=0.8)
        ax.set_yticks(range(len(lanes)), [LANE_LABEL.get(r, r) for r in lanes], fontsize=8)
        ax.set_xlim(lo - t0, hi - t0)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds from the start of the step (step boundaries: black lines)")
    legend = [Patch(facecolor=SPAN_COLOR[n], label=lbl) for n, lbl in [
        ("generate", "generate"), ("reward", "reward"), ("advantages", "advantages"),
        ("ref_forward", "reference forward"), ("old_logprob", "old log-prob recompute"),
        ("train_micro_batch", "train micro-batch"), ("optimizer_step", "optimizer step"),
        ("weight_publish", "weight publish / load"), ("checkpoint", "checkpoint")]]
    legend += [Patch(facecolor=SPAN_COLOR["rollout_residual"], hatch="//", edgecolor="black",
                     label="trainer waits for rollout (residual / queue)"),
               Patch(facecolor=SPAN_COLOR["weight_sync_barrier"], hatch="//", edgecolor="black",
                     label="weight-sync barrier / lock wait"),
               Patch(facecolor=SPAN_COLOR["ref_forward_wait"], hatch="//", edgecolor="black",
                     label="trainer waits for reference"),
               Patch(facecolor="#dddddd", hatch="//", edgecolor="black",
                     label="rollout gated (staleness / queue / lock)")]
    fig.legend(handles=legend, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("Critical path of one training step per system (each panel: where it ran, or EMULATED / "
                 "SIMULATED; veRL and OpenRLHF schedules emulated)", fontsize=11)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.85 / height, 1, 1 - 0.3 / height))  # the legend's and title's inches
    path = out / "critical_path_gantt.png"
    save(fig, path)
    return path


def plot_breakdown(table: pd.DataFrame, out: Path) -> Path:
    """Share of the step time per category on the trainer's path, measured per system and published."""
    fig, ax = plt.subplots(figsize=(11, 0.6 + 0.55 * len(table)))
    labels = list(table.system)
    left = [0.0] * len(table)
    for c in S.CATEGORIES:
        col = f"{c} (s)"
        if col not in table:
            continue
        share = (table[col].fillna(0) / table.step_time_s).tolist()
        ax.barh(labels, share, left=left, color=CATEGORY_COLOR[c], label=c, edgecolor="white")
        left = [a + b for a, b in zip(left, share)]
    rest = [max(0.0, 1 - x) for x in left]
    ax.barh(labels, rest, left=left, color="white", edgecolor="#999999", hatch="..",
            label="not itemised (published figure)")
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the step time on the trainer's critical path")
    ax.set_title("Where the trainer's step goes: our runs (veRL/OpenRLHF emulated; the table's 'measured on' "
                 "says where or how each ran) and published (16xH800)", fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    fig.tight_layout()
    path = out / "critical_path_breakdown.png"
    save(fig, path)
    return path
