"""StreamingLoader: feeds the trainer micro-batches of whole groups as the rows of one partition become ready."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence

from relax.bus import WAIT_S
from relax.bus.batch import Batch
from relax.bus.bus import Bus


def groups_that_fit(tokens: Sequence[int], budget: int) -> int:
    """The packing rule of every micro-batch loader: how many of the leading groups (token counts `tokens`) go
    into the next micro-batch. Consecutive groups while their summed tokens fit `budget`; the first always goes,
    even alone over budget (a group is never split)."""
    n, total = 1, tokens[0]
    while n < len(tokens) and total + tokens[n] <= budget:
        total += tokens[n]
        n += 1
    return n


class StreamingLoader:
    """Iterates micro-batches of partition `step` for consumer `task` until `rows_total` rows were yielded.

    Each micro-batch is whole groups whose summed `length_field` is <= `micro_batch_tokens` (or one group
    that alone exceeds it). It is yielded as soon as anything is ready rather than waiting to fill the
    budget: a trainer with nothing to do gains nothing by waiting. `wait_s` adds up the time spent inside
    the iterator (waiting and transferring), i.e. the trainer's wait for data.
    """

    def __init__(
        self,
        bus: Bus,
        step: int,
        task: str,
        fields: list[str],
        rows_total: int,
        group_size: int,
        micro_batch_tokens: int,
        length_field: str = "total_len",
        timeout_s: float | None = None,
    ):
        if group_size != bus.group_size:
            raise ValueError(f"StreamingLoader: group_size={group_size} but the bus groups rows by {bus.group_size}")
        if rows_total <= 0 or rows_total % group_size:
            raise ValueError(
                f"StreamingLoader: rows_total={rows_total} is not a positive multiple of group_size={group_size}"
            )
        self.bus, self.step, self.task = bus, step, task
        self.fields = list(dict.fromkeys([*fields, length_field]))
        self.rows_total, self.group_size = rows_total, group_size
        self.micro_batch_tokens, self.length_field = micro_batch_tokens, length_field
        self.timeout_s = timeout_s
        self.wait_s = 0.0

    def __iter__(self) -> Iterator[Batch]:
        G = self.group_size
        pending: deque[tuple[Batch, int]] = deque()  # fetched whole groups and their token counts
        pending_tokens = fetched = yielded = 0
        while yielded < self.rows_total:
            t0 = time.perf_counter()
            while True:
                # Pull more only while the groups on hand cannot fill a micro-batch.
                if fetched < self.rows_total and pending_tokens < self.micro_batch_tokens:
                    left = self.rows_total - fetched
                    wait = 0.0  # groups on hand: yield them rather than wait for more
                    if not pending:  # nothing: block until the partition changes, never past timeout_s
                        wait = WAIT_S if self.timeout_s is None else \
                            min(WAIT_S, max(self.timeout_s - (time.perf_counter() - t0), 0.0))
                    got = self.bus.fetch(self.step, self.task, self.fields, left, whole_groups=True, wait=wait)
                    if got is not None:
                        fetched += got.size
                        for lo in range(0, got.size, G):
                            group = got.select(list(range(lo, lo + G)))
                            tokens = int(group[self.length_field].sum())
                            pending.append((group, tokens))
                            pending_tokens += tokens
                if pending:
                    break
                if self.timeout_s is not None and time.perf_counter() - t0 > self.timeout_s:
                    raise TimeoutError(
                        f"StreamingLoader: no group of partition {self.step} ready for '{self.task}' within "
                        f"{self.timeout_s} s ({yielded} of {self.rows_total} rows yielded)"
                    )
            n = groups_that_fit([t for _, t in pending], self.micro_batch_tokens)
            taken = [pending.popleft() for _ in range(n)]
            groups = [g for g, _ in taken]
            pending_tokens -= sum(t for _, t in taken)
            batch = Batch.concat(groups)
            yielded += batch.size
            self.wait_s += time.perf_counter() - t0
            yield batch
