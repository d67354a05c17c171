"""A run that stops making progress ends with a report, never a silent hang.

When no step has finished for `health.stall_timeout_s` (or 3x the slowest step so far, if longer), the supervisor writes `stall.txt` into the run folder
and fails the run with a RuntimeError naming it. The report holds what a person debugging the hang would ask
for first:
  - the bus, per live partition and per consuming task: rows whose input exists, rows the task fetched, rows
    carrying its output, and the rows it fetched but never wrote ("stuck": TQ has no ack, so nothing hands
    those out again by itself);
  - the staleness gate (oldest unconsumed partition, rows held) and the GroupQueue's open claims;
  - a py-spy dump of every role process on this node (where each one is waiting).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from relax.fault.redelivery import live_partitions, produced
from relax.roles.registry import role_class, task_of

REPORT = "stall.txt"
SLOW_STEPS = 3  # a silence this many times the slowest step so far is a stall, even past the timeout


def stall_limit(timeout_s: float, records: dict[int, dict]) -> float:
    """Seconds without a finished step after which the run counts as stalled: `health.stall_timeout_s`, or three
    times the slowest step so far when that is longer (a cluster's 20k-token steps must not trip it)."""
    slowest = max((r.get("step_time_s") or 0.0 for r in records.values()), default=0.0)
    return max(timeout_s, SLOW_STEPS * slowest)


def task_state(bus, step: int, task: str, reads: list[str], writes: list[str]) -> dict:
    """Partition `step` as `task` sees it: rows whose input exists, rows fetched, rows carrying the output, and
    the rows fetched but never written (a role with no output field, the Actor, has none)."""
    from relax.bus.bus import partition_id

    ready, written = produced(bus, step, reads), produced(bus, step, writes)
    index, consumed = bus._tq().get_consumption_status(task_name=task, partition_id=partition_id(step))
    fetched = set() if index is None else {
        int(g) for g, c in zip(torch.as_tensor(index).tolist(), torch.as_tensor(consumed).tolist()) if c}
    return {"input_ready": len(ready), "fetched": len(fetched), "written": len(written),
            "fetched_not_written": sorted(fetched - written) if writes else []}


def bus_state(bus, cfg, role_names) -> list[str]:
    """One line per (live partition, consuming role)."""
    lines = []
    for k in live_partitions(bus):
        lines.append(f"partition {k}: {len(produced(bus, k, ['sample_id']))} rows")
        for n in role_names:
            task = task_of(n) if n != "rollout" else None
            if task:
                cls = role_class(n)
                reads, writes = (cls.train_reads(cfg), []) if n == "actor" else (cls.reads(cfg), cls.writes(cfg))
                state = task_state(bus, k, task, reads, writes)
                lines.append(f"  {n:<11} task={task:<16} " + " ".join(f"{a}={b}" for a, b in state.items()))
    return lines


def py_spy(pid: int) -> str:
    """The Python stacks of process `pid` (py-spy ships with the engine's dependencies), or why not."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30, check=False)
        return out.stdout or out.stderr
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"py-spy dump failed: {err}"


def write_report(run_dir, sections: dict[str, list[str] | str]) -> Path:
    path = Path(run_dir) / REPORT
    parts = []
    for title, body in sections.items():
        parts.append(f"== {title}\n" + (body if isinstance(body, str) else "\n".join(body)))
    path.write_text("\n\n".join(parts) + "\n")
    return path
