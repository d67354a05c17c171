"""Bus redelivery after a role died: TransferQueue marks rows consumed when they are fetched (there is no
ack), so rows a killed role fetched but never wrote are lost to its task unless handed out again.

`redeliver(bus, task)` resets the task's consumption on every live partition (TQ `reset_consumption`); the
restarted role then skips rows whose output fields already exist (`produced`). `existing_groups` tells a
rollout replica which groups of a partition already landed (a claim cut mid-put must not be generated twice).
`waiting` counts what a task has still to fetch (the role's queue depth on the bus, for /metrics).
"""

from __future__ import annotations

import uuid

import torch

from relax.bus.bus import Bus, partition_id


def live_partitions(bus: Bus) -> list[int]:
    out = []
    for name in bus._tq().get_partition_list():
        prefix, _, k = name.partition("_")
        if prefix == "train" and k.isdigit():
            out.append(int(k))
    return sorted(out)


def redeliver(bus: Bus, task: str, from_step: int = 0) -> list[int]:
    """Hand every row of the live partitions >= from_step out again to `task`; returns those partitions."""
    steps = [k for k in live_partitions(bus) if k >= from_step]
    client = bus._tq()
    for k in steps:
        client.reset_consumption(partition_id(k), task)
        bus.touch(k)
    return steps


def _probe(bus: Bus, step: int, fields: list[str]):
    """Metadata of every row of partition `step` on which all of `fields` exist, read under a private task
    name (it consumes nothing any role reads). Goes through the same sampler as every fetch: TQ's production
    status query fails while a put is reserving rows, the sampler path does not."""
    return bus._tq().get_meta(data_fields=list(fields), batch_size=1, partition_id=partition_id(step),
                              task_name=f"probe-{uuid.uuid4().hex}",
                              sampling_config={"max_rows": 10**9, "group_size": bus.group_size, "whole_groups": False})


def produced(bus: Bus, step: int, fields: list[str]) -> set[int]:
    """Global indexes of the rows of partition `step` on which every one of `fields` exists."""
    if not fields:
        return set()
    return set(_probe(bus, step, fields).global_indexes)


def waiting(bus: Bus, step: int, task: str, fields: list[str]) -> int:
    """Rows of partition `step` whose `fields` all exist and that `task` has not fetched yet."""
    ready = produced(bus, step, fields)
    index, consumed = bus._tq().get_consumption_status(task_name=task, partition_id=partition_id(step))
    if index is None:  # the partition is gone (trained and cleared since it was listed)
        return 0
    done = {int(g) for g, c in zip(torch.as_tensor(index).tolist(), torch.as_tensor(consumed).tolist()) if c}
    return len(ready - done)


def existing_groups(bus: Bus, step: int) -> set[int]:
    """group_id of every row already on partition `step`."""
    meta = _probe(bus, step, ["group_id"])
    if meta.size == 0:
        return set()
    return set(torch.as_tensor(bus._tq().get_data(meta)["group_id"]).tolist())
