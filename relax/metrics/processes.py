"""Where a run's CPU goes, by process: the driver and every process it started (Ray's workers and daemons), each
named as Ray titles it (`ray::ActorRole`, `ray::TransferQueueController`, ...), so a reader sees the roles' share of
the machine beside the bus's, the DCS's, Ray's and the driver's (summary.json `cpu_by_process_per_step_s`).

Two snapshots, at the first step's start and at the schedule's end; a process started between them counts from
zero, one that ended between them (a killed role) is missing from the second and counts nothing.
"""

from __future__ import annotations

import os

import psutil


def label(proc: psutil.Process, driver_pid: int) -> str:
    """A process's name in the table: "driver", the Ray actor class (the title less its current method: Ray
    titles a busy actor `ray::Class.method`), or the executable or script of a Ray daemon."""
    if proc.pid == driver_pid:
        return "driver"
    cmd = proc.cmdline()
    if not cmd:
        return proc.name()
    if cmd[0].startswith("ray::"):
        return cmd[0].split()[0].split(".")[0]
    script = next((c for c in cmd[1:] if c.endswith(".py")), None)  # python -u .../log_monitor.py ...
    return os.path.basename(script or cmd[0])


def snapshot(root: psutil.Process | None = None) -> dict[tuple[int, float], tuple[str, float]]:
    """(pid, create time) -> (label, CPU seconds so far) for `root` (default: this process) and its descendants."""
    root = root or psutil.Process()
    out = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            with p.oneshot():
                t = p.cpu_times()
                out[(p.pid, p.create_time())] = (label(p, root.pid), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def cpu_by_process(start: dict, end: dict, steps: int) -> dict[str, float]:
    """Core-seconds per step by label between two snapshots, largest first."""
    total: dict[str, float] = {}
    for key, (name, cpu) in end.items():
        total[name] = total.get(name, 0.0) + cpu - start.get(key, (name, 0.0))[1]
    return {n: round(v / max(steps, 1), 4) for n, v in sorted(total.items(), key=lambda kv: -kv[1]) if v > 0}
