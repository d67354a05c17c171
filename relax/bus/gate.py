"""The bus coordinator: staleness gate, capacity accounting and change notices, in one small named async Ray
actor.

It lives in its own actor (not the driver) so every role process sees one state and the driver is free to
block. Its methods are coroutines: a producer parked in `wait_can_start` or `reserve` never blocks the
trainer's `mark_trained` or `release`, which are what wake it up; a consumer parked in `wait_changed` (nothing
of its partition was ready) is woken by the next `touch` of that partition -- a put, a write, a redelivery --
instead of polling TransferQueue.
"""

from __future__ import annotations

import asyncio

import ray

class PartitionTrained(ValueError):
    """A put into a partition the trainer already finished (every one of its groups was trained)."""


def can_start(step: int, oldest_unconsumed: int, max_staleness: int) -> bool:
    """The staleness gate (DESIGN.md section 3): rollout may start partition `step` only while
    step - oldest_unconsumed <= max_staleness. The Coordinator and the simulator (relax/sim/) both ask this."""
    return step - oldest_unconsumed <= max_staleness


NAME = "relax_bus_coordinator"
NAMESPACE = "relax"


@ray.remote(num_cpus=0, max_concurrency=1000)
class Coordinator:
    def __init__(self, capacity_rows: int, group_size: int, max_staleness: int):
        self.capacity_rows = capacity_rows
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.changed = asyncio.Condition()
        # Change counts outlive a reset (Bus.reset: a new run on the same bus): they only grow, so a count a consumer
        # read in an earlier run is never taken for a later one (Bus.fetch waits on the count it read last).
        self.changes: dict[int, int] = {}  # per partition: how many times rows landed or became fetchable again
        # ...and per field: how many times rows landed with it (a put, a write); None: rows became fetchable again
        # for some task whatever their fields (a redelivery). A consumer watches only the fields it needs.
        self.field_changes: dict[int, dict[str | None, int]] = {}
        self._new_run()

    def _new_run(self) -> None:
        self.oldest = 0  # lowest partition not yet marked trained
        self.trained: set[int] = set()  # marked trained but above `oldest` (finished out of order)
        self.held: dict[int, int] = {}  # rows held per partition (reserved by puts, freed by release)
        self.puts = 0  # sequence number of the next put; orders rows across concurrent producers

    async def settings(self) -> dict:
        return {"capacity_rows": self.capacity_rows, "group_size": self.group_size, "max_staleness": self.max_staleness}

    async def reset(self, max_staleness: int | None) -> None:
        async with self.changed:
            if max_staleness is not None:
                self.max_staleness = max_staleness
            self._new_run()
            self.changed.notify_all()

    async def wait_can_start(self, step: int, timeout: float | None) -> None:
        async with self.changed:
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: can_start(step, self.oldest, self.max_staleness)), timeout
                )
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"wait_can_start({step}): still gated after {timeout} s "
                    f"(oldest unconsumed {self.oldest}, max_staleness {self.max_staleness})"
                ) from None

    async def mark_trained(self, step: int) -> None:
        async with self.changed:
            if step >= self.oldest:
                self.trained.add(step)
            while self.oldest in self.trained:
                self.trained.remove(self.oldest)
                self.oldest += 1
            self.changed.notify_all()

    async def touch(self, step: int, fields: list[str] | None = None) -> None:
        """Rows of partition `step` landed with `fields` (None: became fetchable again, whatever their fields): wake
        the consumers waiting on it."""
        async with self.changed:
            self.changes[step] = self.changes.get(step, 0) + 1
            counts = self.field_changes.setdefault(step, {})
            for f in fields or [None]:
                counts[f] = counts.get(f, 0) + 1
            self.changed.notify_all()

    def _count(self, step: int, fields: list[str] | None) -> int:
        if fields is None:
            return self.changes.get(step, 0)
        counts = self.field_changes.get(step, {})
        return counts.get(None, 0) + sum(counts.get(f, 0) for f in fields)

    async def wait_changed(self, step: int, seen: int | None, timeout: float, fields: list[str] | None = None) -> int:
        """Partition `step`'s change count over `fields` (None: every field), once it differs from `seen` (None: at
        once), the partition is trained, or `timeout` s have passed. A consumer reads it, fetches, and if nothing
        was ready waits on what it read: a change between the two is never missed. Rows can become ready for it
        only when one of the fields it needs lands (or a redelivery), so another field's write does not wake it:
        each spurious wake was one more fetch through TransferQueue."""
        async with self.changed:
            if seen is not None:
                try:
                    await asyncio.wait_for(self.changed.wait_for(
                        lambda: self._count(step, fields) != seen or step < self.oldest), timeout)
                except asyncio.TimeoutError:
                    pass
            return self._count(step, fields)

    async def oldest_unconsumed(self) -> int:
        return self.oldest

    async def reserve(self, step: int, rows: int, timeout: float | None, puts: int = 1) -> int:
        """Wait until `rows` more rows fit, then hold them for `step`; returns the sequence number of the first of
        `puts` consecutive puts (a process's concurrent puts, sent as one)."""
        if rows > self.capacity_rows:
            raise ValueError(f"put_rows: {rows} rows can never fit in bus.capacity_rows={self.capacity_rows}")
        async with self.changed:
            if step < self.oldest:
                raise PartitionTrained(
                    f"put_rows: partition {step} was already marked trained (oldest unconsumed {self.oldest})"
                )
            try:
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: sum(self.held.values()) + rows <= self.capacity_rows), timeout
                )
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"put_rows: bus full for {timeout} s: {sum(self.held.values())} of bus.capacity_rows="
                    f"{self.capacity_rows} rows held (partitions {sorted(self.held)}); is the trainer clearing them?"
                ) from None
            self.held[step] = self.held.get(step, 0) + rows
            self.puts += puts
            return self.puts - puts

    async def release(self, step: int, rows: int | None = None) -> None:
        """Free `rows` rows of `step` (a failed put), or all of them (the partition was cleared)."""
        async with self.changed:
            left = 0 if rows is None else self.held.get(step, 0) - rows
            if left > 0:
                self.held[step] = left
            else:
                self.held.pop(step, None)
            self.changed.notify_all()

    async def held_rows(self) -> dict[int, int]:
        return dict(self.held)
