"""Bus redelivery after a role died: TransferQueue marks rows consumed when they are fetched (there is no
ack), so rows a killed role fetched but never wrote are lost to its task unless handed out again.

`redeliver(bus, task)` resets the task's consumption on every live partition (TQ `reset_consumption`); the
restarted role then skips rows whose output fields already exist (`produced`). `existing_groups` tells a
rollout replica which groups of a partition already landed (a claim cut mid-put must not be generated twice).
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
    return steps


def produced(bus: Bus, step: int, fields: list[str]) -> set[int]:
    """Global indexes of the rows of partition `step` on which every one of `fields` exists."""
    if not fields:
        return set()
    index, status = bus._tq().get_production_status(list(fields), partition_id(step))
    if index is None or status is None or index.numel() == 0:
        return set()
    done = status.bool().all(dim=1) if status.dim() == 2 else status.bool()
    return set(index[done].tolist())


def existing_groups(bus: Bus, step: int) -> set[int]:
    """group_id of every row already on partition `step` (read under a private task name: consumes nothing
    anyone else reads)."""
    client = bus._tq()
    pid = partition_id(step)
    if pid not in client.get_partition_list():
        return set()
    meta = client.get_meta(data_fields=["group_id"], batch_size=1, partition_id=pid, task_name=f"probe-{uuid.uuid4().hex}",
                           sampling_config={"max_rows": 10**9, "group_size": bus.group_size, "whole_groups": False})
    if meta.size == 0:
        return set()
    ids = client.get_data(meta)["group_id"]
    return set(torch.as_tensor(ids).tolist())
