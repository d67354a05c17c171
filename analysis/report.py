"""`relax report RUN_DIR... [--against published] [--format markdown|csv]`: a table of runs.

One row per run (a run folder, or every run folder below a folder named): its system (relax mode, or a
schedule emulated), steps/hour, mean step time, reward at the start and end, held-out accuracy before and
after RL, staleness and pipeline efficiency. Column `kind` says how each number came about: measured, EMULATED (the
real engine on emulated GPUs: its step times are the emulated hardware's seconds, the compression undone) or
SIMULATED (`relax simulate`: no engine ran, so it has no rewards). `--against published` adds the paper's numbers
for the same system (16xH800) and the speed-up of each run over the first one (the first run's step time over this
one's: above 1 is faster) beside the published one: the way to put a new algorithm or schedule next to the paper.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.results import (SYSTEMS, hardware, load_config, load_summary, published_metric, run_kind,
                              system_of)
from relax.run_folder import find_runs


def _round(x, nd=3):
    return None if x is None else round(float(x), nd)


def report_table(paths: list[Path | str], against: str | None = None) -> pd.DataFrame:
    runs = find_runs(paths)
    summaries = [load_summary(r) for r in runs]
    keys = [system_of(s) for s in summaries]
    kinds = [run_kind(s) for s in summaries]
    rows = []
    for run, s, key, (kind, timing) in zip(runs, summaries, keys, kinds):
        rows.append({
            "run": "/".join(Path(run).parts[-3:]),
            "system": SYSTEMS[key].label if key in SYSTEMS else key,
            "kind": kind,
            "algorithm": "{}/{}".format(*_algorithm(run)),
            "steps": s["steps"],
            "steps/hour": _round(timing["steps_per_hour"], 1),
            "step time (s)": _round(timing["mean_step_time_s"], 4),
            "reward start": _round(s.get("initial_reward")),
            "reward end": _round(s.get("final_reward")),
            "eval acc start": _round(s.get("eval_accuracy_start")),
            "eval acc end": _round(s.get("eval_accuracy_end")),
            "max staleness": s.get("max_staleness"),
            "staleness seen (max)": s.get("staleness_max"),
            "pipeline efficiency": s.get("pipeline_efficiency"),
            "trainer wait share": s.get("trainer_wait_share"),
            "hardware": hardware(s, load_config(run)),
        })
    df = pd.DataFrame(rows)
    if against == "published" and rows:
        base_key = keys[0]
        # Relax async beside veRL: the paper's vs-veRL run, else its modes table (two different step times).
        ctx = "verl" if "verl" in keys else base_key
        pub_step = [published_metric(k, "step_time", against=ctx) if k in SYSTEMS else None for k in keys]
        pub_sph = [published_metric(k, "steps_per_hour", against=ctx) if k in SYSTEMS else None for k in keys]
        df["published step time (s, 16xH800)"] = pub_step
        df["published steps/hour (16xH800)"] = pub_sph
        step = [timing["mean_step_time_s"] for _, timing in kinds]
        df["speed-up vs first run, this table (x)"] = [round(step[0] / t, 3) for t in step]
        df["speed-up vs first run, published (x)"] = [_published_speedup(base_key, k) for k in keys]
    return df


def _published_speedup(base: str, key: str) -> float | None:
    """Published step time of `base` over that of `key` (each taken from the paper's run that compares them)."""
    if base not in SYSTEMS or key not in SYSTEMS:
        return None
    a = published_metric(base, "step_time", against=key)
    b = published_metric(key, "step_time", against=base)
    return round(a / b, 3) if a and b else None


def _algorithm(run: Path) -> tuple[str, str]:
    algo = load_config(run).get("algorithm", {})
    return algo.get("advantage", "?"), algo.get("policy_loss", "?")


def format_table(df: pd.DataFrame, fmt: str = "markdown") -> str:
    if fmt == "csv":
        return df.to_csv(index=False)
    text = df.to_markdown(index=False)
    emulated = any("(emulated)" in str(s) for s in df.get("system", []))
    kinds = set(df.get("kind", []))
    notes = []
    if emulated:
        notes.append("(emulated): the veRL / OpenRLHF schedule emulated in Relax with Relax's kernels, not that "
                     "framework.")
    if any(k.startswith("EMULATED") for k in kinds):
        notes.append("EMULATED: the real engine on this machine, each unit of GPU work paced to the cost model's "
                     "time on that hardware; step times in the emulated hardware's seconds.")
    if any(k.startswith("SIMULATED") for k in kinds):
        notes.append("SIMULATED: the cost model and discrete-event simulator (relax simulate); no engine ran.")
    if any(c.startswith("published") for c in df.columns):
        notes.append("Published: Relax paper (arXiv 2604.11554), 16xH800, Qwen3-4B; measured: the hardware column. "
                     "Compare speed-ups, not absolute times.")
    return text + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def main(args) -> int:
    import sys

    try:
        table = report_table(args.runs, against=args.against)
    except FileNotFoundError as err:
        print(f"relax report: {err}", file=sys.stderr)
        return 2
    print(format_table(table, args.format), end="")
    return 0
