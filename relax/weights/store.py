"""Weight sync, first version: the Actor publishes versioned weights through Ray's object store.

The Actor `ray.put`s its state dict and registers the ObjectRef here under a version; Rollout and
Reference pull the newest version they have not loaded. The store keeps only the latest refs alive.
"""

from __future__ import annotations

import asyncio

import ray


@ray.remote(num_cpus=0)
class WeightStore:
    def __init__(self):
        self.version = -1
        self.refs: list = []  # [ObjectRef] wrapped in a list so Ray passes the ref, not the value
        self.cond = asyncio.Condition()

    async def publish(self, version: int, refs: list) -> None:
        async with self.cond:
            if version <= self.version:
                raise ValueError(f"weight version {version} is not newer than {self.version}")
            self.version, self.refs = version, refs
            self.cond.notify_all()

    async def latest(self) -> tuple[int, list]:
        return self.version, self.refs

    async def wait_for(self, version: int, timeout: float | None = None) -> tuple[int, list]:
        """Block until a version >= `version` exists (on-policy rollout waits for the trainer)."""
        async with self.cond:
            await asyncio.wait_for(self.cond.wait_for(lambda: self.version >= version), timeout)
            return self.version, self.refs


def fetch_weights(store, have_version: int, min_version: int | None = None):
    """(version, state_dict) if the store has something newer than `have_version`, else (have_version, None)."""
    if min_version is not None and min_version > have_version:
        version, refs = ray.get(store.wait_for.remote(min_version))
    else:
        version, refs = ray.get(store.latest.remote())
    if version <= have_version:
        return have_version, None
    return version, ray.get(refs[0])
