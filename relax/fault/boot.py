"""Start-up timeline of a role process: where the seconds of a restart go.

A role records marks while it starts (`BootClock.mark`); `phases()` turns them into consecutive durations:
  spawn     process created (the OS's start time) -> the `relax` package starts importing (Ray's worker
            start-up: python, `import ray`, connecting to the raylet and the GCS)
  imports   -> the role's constructor begins (torch, tensordict, TransferQueue, relax: unpickling the class)
  then one phase per mark the constructor sets (DCS join, model build, engine, task data, weight fetch, ...).
The supervisor stores them with each recovery (recovery.json, `boot`), so a report can say what a restart
costs and where.
"""

from __future__ import annotations

import time

import psutil

import relax


class BootClock:
    def __init__(self):
        self.marks: list[tuple[str, float]] = [("process", psutil.Process().create_time()),
                                               ("spawn", relax.IMPORTED_AT), ("imports", time.time())]

    def mark(self, name: str) -> None:
        """The phase `name` ended now."""
        self.marks.append((name, time.time()))

    def phases(self) -> dict[str, float]:
        out = {}
        for (_, t0), (name, t1) in zip(self.marks, self.marks[1:]):
            out[name] = round(t1 - t0, 4)
        return out

    def started(self) -> float:
        return self.marks[0][1]

