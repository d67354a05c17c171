"""Pieces the emulated schedules share: take a whole partition off the bus, cut it into micro-batches, run
the trainer's log-prob forwards, and drive the roles' long-running calls from the driver."""

from __future__ import annotations

import time

import ray
import torch

from relax.bus import WAIT_S, Batch, Bus
from relax.bus.loader import groups_that_fit
from relax.moe.fields import r3_fields


def fetch_all(bus: Bus, step: int, task: str, fields: list[str], rows_total: int, group_size: int,
              timeout_s: float | None = 600.0) -> Batch:
    """Every row of partition `step` once all `fields` are written (whole groups), sorted by sample_id.

    This is the non-streaming hand-off of veRL and OpenRLHF: the trainer sees nothing until the whole batch
    is there."""
    fields = list(dict.fromkeys([*fields, "sample_id"]))
    parts, got, t0 = [], 0, time.monotonic()
    while got < rows_total:
        batch = bus.fetch(step, task, fields, max_rows=rows_total - got, whole_groups=True, wait=WAIT_S)
        if batch is None:
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"fetch_all: partition {step} gave {got} of {rows_total} rows to '{task}' "
                                   f"within {timeout_s} s")
            continue
        parts.append(batch)
        got += batch.size
    whole = Batch.concat(parts)
    order = torch.argsort(whole["sample_id"]).tolist()
    return whole.select(order)


def trainer_fields(actor) -> list[str]:
    """The fields the Actor trains on, less the reference log-probs (the emulated trainer gets them itself)."""
    return [f for f in actor.fields if f != "ref_log_probs"]


def replayed_routing(cfg, batch: Batch) -> dict | None:
    """R3: the batch's recorded routing (`rollout_routed_experts`) for a log-prob forward that must replay it
    (the emulated trainers' old-log-prob and reference calls), or None when R3 is off."""
    fields = r3_fields(cfg)
    return {f: batch[f] for f in fields} if fields else None


def align(batch: Batch, other: Batch, field: str) -> list:
    """`other[field]` reordered to `batch`'s rows (matched by sample_id)."""
    pos = {int(s): i for i, s in enumerate(other["sample_id"].tolist())}
    values = other[field]
    return [values[pos[int(s)]] for s in batch["sample_id"].tolist()]


class WholeBatchLoader:
    """Micro-batches of whole groups cut from a batch already in memory, by the streaming loader's packing rule
    (`relax.bus.loader.groups_that_fit`). `wait_s` is 0: the schedule records its own waits."""

    def __init__(self, batch: Batch, group_size: int, micro_batch_tokens: int, length_field: str = "total_len"):
        if batch.size % group_size:
            raise ValueError(f"WholeBatchLoader: {batch.size} rows is not a whole number of groups of {group_size}")
        self.batch, self.G, self.budget, self.length_field = batch, group_size, micro_batch_tokens, length_field
        self.wait_s = 0.0

    def __iter__(self):
        lengths = self.batch[self.length_field].tolist()
        group_tokens = [sum(lengths[lo:lo + self.G]) for lo in range(0, self.batch.size, self.G)]
        first = 0  # index of the next group to pack
        while first < len(group_tokens):
            n = groups_that_fit(group_tokens[first:], self.budget)
            yield self.batch.select(list(range(first * self.G, (first + n) * self.G)))
            first += n


def drive(ctx, bar, futures: dict, until: str = "actor") -> None:
    """Wait for the roles' long-running calls, polling telemetry for the progress bar; a role's failure is
    raised here, naming it. Returns once `until` has finished and then every other call."""
    pending = list(futures)
    done_until = False
    while not done_until:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                raise RuntimeError(f"role '{futures[ref]}' failed: {err}") from err
            done_until |= futures[ref] == until
        ctx.poll(bar)
        ctx.obey_stop()
    ray.get(pending)


def finish(actor) -> None:
    """End of a trainer loop, as the Actor's own run() ends: free the partitions whose weight version is
    committed (held by a second process), then ship the last spans."""
    release = getattr(actor, "release_committed", None)
    if release is not None:
        release(wait_s=60.0)
    actor.rec.flush()
