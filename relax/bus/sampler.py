"""The sampler that runs inside TransferQueue's controller and picks which ready rows a fetch returns.

Why not TQ's GRPOGroupNSampler: it treats any run of `n` consecutive global indexes as a group, so it can
hand out a window straddling two groups, and TQ reuses the global indexes of cleared partitions, so a
group's rows need not even be consecutive. Instead every row carries its place in the bus as TQ custom
metadata, ``{PUT_KEY: put sequence number, ROW_KEY: position within that put}``; a put always holds whole
groups, so ``(put, row // group_size)`` names the row's group exactly.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from transfer_queue.sampler import BaseSampler

PUT_KEY = "relax_put"
ROW_KEY = "relax_row"


class GroupSampler(BaseSampler):
    """Returns up to `max_rows` ready rows in insertion order; with `whole_groups`, complete groups only.

    The bus asks TQ for batch_size=1 (TQ's polling mode refuses a fetch outright when fewer than
    batch_size rows are ready) and passes the real limits in `sampling_config`, which TQ forwards here.
    """

    def sample(
        self,
        ready_indexes: list[int],
        batch_size: int,
        *args: Any,
        partition: Any = None,
        max_rows: int | None = None,
        group_size: int = 1,
        whole_groups: bool = False,
        **kwargs: Any,
    ) -> tuple[list[int], list[int]]:
        limit = batch_size if max_rows is None else max_rows
        meta = partition.get_custom_meta(ready_indexes)
        # Rows become ready (storage notified) a moment before TQ stores their custom metadata; they are
        # skipped until it arrives, so ordering and grouping never guess.
        placed = sorted((m[PUT_KEY], m[ROW_KEY], i) for i, m in meta.items() if PUT_KEY in m)
        if not whole_groups:
            picked = [i for _, _, i in placed[:limit]]
            return picked, picked
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for put, row, i in placed:
            groups[(put, row // group_size)].append(i)
        picked = []
        for rows in groups.values():  # dicts keep insertion order, which is sorted here
            if len(rows) == group_size:
                if len(picked) + group_size > limit:
                    break
                picked += rows
        return picked, picked
