"""Recovery results of a run with injected faults: a table and a figure.

    .venv/bin/python -m relax.fault.report RUN_DIR [RUN_DIR ...] [--out DIR]

Per fault (from `recovery.json` and `metrics.jsonl`):
  detect_s      fault -> the supervisor saw the process gone
  ready_s       fault -> the replacement answered (Tier 2: every role restarted)
  throughput_s  fault -> the end of the first step that starts a run of 3 steps whose mean step time is within
                1.25x the median step time before the fault ("back to the previous throughput"); None if the
                run ended first
  dcs_s/bytes   the replacement's weight transfer from a live DCS peer
  disk_s/bytes  reloading the same weights from the Actor's disk checkpoint in the same process (page cache
                warm: the file was just written), measured for comparison
plus the run's samples lost / duplicated. Writes recovery_table.md and recovery.png next to the run (or --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SLOWER = 1.25  # steps within this factor of the pre-fault median count as "previous throughput"
WINDOW = 3  # ... over this many consecutive steps (single steps are noisy on a shared 2-core machine)


def load_run(run_dir: Path) -> tuple[list[dict], dict, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, json.loads((run_dir / "recovery.json").read_text()), json.loads((run_dir / "summary.json").read_text())


def back_to_throughput(rows: list[dict], t_fault: float) -> float | None:
    before = [r["step_time_s"] for r in rows[1:] if r["wall_time_s"] < t_fault]  # step 0 includes the fill
    if not before:
        return None
    bar = SLOWER * statistics.median(before)
    after = [r for r in rows if r["wall_time_s"] > t_fault]
    for i in range(len(after) - WINDOW + 1):
        if statistics.mean(r["step_time_s"] for r in after[i : i + WINDOW]) <= bar:
            return after[i]["wall_time_s"] - t_fault
    return None


def table(run_dir: Path) -> list[dict]:
    rows, rec, summary = load_run(run_dir)
    out = []
    for ev in rec["events"]:
        if ev.get("t_fault") is None:
            continue
        out.append({
            "run": run_dir.name, "role": ev["role"] + (f"-{ev['replica']}" if ev.get("replica") is not None else ""),
            "tier": ev["tier"], "at_step": ev.get("steps_done_at_detect"),
            "detect_s": ev.get("detect_s"), "ready_s": ev.get("ready_s"),
            "throughput_s": back_to_throughput(rows, ev["t_fault"]),
            "dcs_s": ev.get("dcs_seconds"), "dcs_bytes": ev.get("dcs_bytes"), "dcs_from": ev.get("dcs_src"),
            "disk_s": ev.get("disk_seconds"), "disk_bytes": ev.get("disk_bytes"),
            "rolled_back_versions": ev.get("rolled_back_versions"),
            "samples_lost": summary["samples_lost"], "samples_duplicated": summary["samples_duplicated"],
        })
    return out


def markdown(entries: list[dict]) -> str:
    cols = ["run", "role", "tier", "at_step", "detect_s", "ready_s", "throughput_s", "dcs_s", "dcs_bytes", "dcs_from",
            "disk_s", "disk_bytes", "samples_lost", "samples_duplicated"]

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(e.get(c)) for c in cols) + " |" for e in entries]
    return "\n".join(lines) + "\n"


def figure(run_dir: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, rec, _ = load_run(run_dir)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    ends = [0.0] + [r["wall_time_s"] for r in rows]
    ax.step(ends, range(len(ends)), where="post", color="#333", lw=1.2, label="training steps done (slope: throughput)")
    ax.set_ylim(0, len(rows) * 1.08)
    colors = {1: "#d62728", 2: "#9467bd"}
    for ev in rec["events"]:
        if ev.get("t_fault") is None:
            continue
        c = colors.get(ev["tier"], "#777")
        name = ev["role"] + (f"-{ev['replica']}" if ev.get("replica") is not None else "")
        ax.axvline(ev["t_fault"], color=c, ls="--", lw=1)
        if ev.get("t_ready") is not None:
            ax.axvspan(ev["t_fault"], ev["t_ready"], color=c, alpha=0.12)
        ax.text(ev["t_fault"], ax.get_ylim()[1] * 0.98, f" kill {name} (tier {ev['tier']})", color=c, fontsize=8,
                va="top", rotation=90)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("training steps")
    ax.set_title(f"{run_dir.name}: throughput around injected kills (shaded: fault -> replacement ready)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, help="folder for recovery_table.md / recovery.png (default: the run)")
    args = ap.parse_args(argv)
    entries = []
    for run in args.runs:
        entries += table(run)
        out = args.out or run
        out.mkdir(parents=True, exist_ok=True)
        figure(run, out / (f"recovery-{run.name}.png" if args.out else "recovery.png"))
    text = markdown(entries)
    (args.out or args.runs[0]).joinpath("recovery_table.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
