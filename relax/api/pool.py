"""The rollout pool: several RolloutRole replicas sharing the groups of every partition.

`GroupQueue` (a small async Ray actor) hands out chunks of groups to replicas: the lowest partition first,
re-issued work before fresh work. A claim is open until the replica reports it put on the bus; when a replica
dies its open claims go back to the queue (a claim cut mid-put is flagged `maybe_put`, and the replica that
takes it checks the bus for groups that did land first, so nothing is generated twice). A draining replica
gets no new claim and stops once its open claim is done: that is how scale-in drains in-flight requests.

`RolloutPool` is the interface the elastic scaling API drives (add / health-check / sync / activate / drain /
remove a replica); `RayRolloutPool` implements it over RolloutRole actors, tests implement it with fakes.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import ray

from relax.fault.heartbeat import healthy, wait_exited

MID_PUT_HOLD_S = 30.0  # the longest an armed replica waits, held mid-put, for its kill (GroupQueue.landed)


@ray.remote(num_cpus=0, max_concurrency=1000)
class GroupQueue:
    def __init__(self, steps: int, prompts_per_step: int, chunk_groups: int):
        self.steps, self.P, self.chunk = steps, prompts_per_step, chunk_groups
        self.next_group: dict[int, int] = defaultdict(int)  # partition -> next group never handed out
        self.returned: dict[int, list[tuple[list[int], bool]]] = defaultdict(list)  # re-issued (groups, maybe_put)
        self.done: dict[int, int] = defaultdict(int)  # partition -> groups on the bus
        self.claims: dict[int, dict] = {}
        self.draining: set[int] = set()
        self.generated: dict[int, int] = defaultdict(int)  # replica -> groups it put on the bus
        self.ids = itertools.count()
        # A due mid_put kill (FaultSpec.mid_put) arms its replica: the replica's next claim to land a group stops
        # there (`landed`) until the kill comes, so the kill cuts that claim mid-put however busy the machine is.
        self.armed: set[int] = set()
        self.held: dict[int, asyncio.Event] = defaultdict(asyncio.Event)  # replica -> set while it is held
        self.unhold: dict[int, asyncio.Event] = defaultdict(asyncio.Event)  # replica -> set to let it go on

    def _new_claim(self, replica: int, step: int, groups: list[int], maybe_put: bool) -> dict:
        cid = next(self.ids)
        self.claims[cid] = {"replica": replica, "step": step, "groups": groups, "putting": False}
        return {"cid": cid, "step": step, "groups": groups, "maybe_put": maybe_put}

    async def claim(self, replica: int, upto: int, most: int | None = None) -> dict:
        """Work for `replica`, which may start partitions <= `upto` (the staleness gate let it): at most
        chunk_groups fresh groups, or `most` if fewer (a streaming replica claims only what its free slots start).

        Returns a claim {cid, step, groups, maybe_put}, or {"next": True} (move on to partition upto+1),
        {"wait": True} (others hold the last open work) or {"stop": True} (all done, or draining)."""
        if replica in self.draining:
            return {"stop": True}
        for j in sorted(self.returned):
            if j <= upto and self.returned[j]:
                groups, maybe_put = self.returned[j].pop(0)
                return self._new_claim(replica, j, groups, maybe_put)
        for j in range(min(upto, self.steps - 1) + 1):  # never a partition past the run's last
            if self.next_group[j] < self.P:
                lo = self.next_group[j]
                self.next_group[j] = min(self.P, lo + min(self.chunk, most or self.chunk))
                return self._new_claim(replica, j, list(range(lo, self.next_group[j])), False)
        if upto < self.steps - 1:
            return {"next": True}
        if all(self.done[j] >= self.P for j in range(self.steps)):
            return {"stop": True}
        return {"wait": True}

    async def putting(self, cid: int) -> bool:
        """The claim's first put begins: from here on a crash may leave some of its groups on the bus (maybe_put).
        True when its replica is armed: the replica then calls `landed` once that put is on the bus."""
        c = self.claims[cid]
        c["putting"] = True
        return c["replica"] in self.armed

    async def landed(self, cid: int) -> None:
        """An armed replica's claim has its first group(s) on the bus and the rest not yet: the replica waits here,
        cut mid-put, until it is killed (`release`) or MID_PUT_HOLD_S pass (then it goes on, and stays armed)."""
        replica = self.claims[cid]["replica"] if cid in self.claims else None
        if replica not in self.armed:
            return
        self.held[replica].set()
        try:
            await asyncio.wait_for(self.unhold[replica].wait(), MID_PUT_HOLD_S)
        except asyncio.TimeoutError:
            pass
        finally:
            self.held.pop(replica, None)
            self.unhold.pop(replica, None)

    async def finish(self, cid: int, groups_put: int) -> None:
        c = self.claims.pop(cid)
        self.done[c["step"]] += len(c["groups"])
        self.generated[c["replica"]] += groups_put

    async def release(self, replica: int) -> int:
        """`replica` is gone: its open claims are handed out again. Returns how many."""
        mine = [cid for cid, c in self.claims.items() if c["replica"] == replica]
        for cid in mine:
            c = self.claims.pop(cid)
            self.returned[c["step"]].append((c["groups"], c["putting"]))
        self.draining.discard(replica)
        self.armed.discard(replica)
        if (hold := self.unhold.get(replica)) is not None:
            hold.set()
        return len(mine)

    async def drain(self, replica: int) -> None:
        self.draining.add(replica)

    async def partly_put(self, replica: int) -> int:
        """Open claims of `replica` whose put has begun: a crash now leaves some of their groups on the bus."""
        return sum(1 for c in self.claims.values() if c["replica"] == replica and c["putting"])

    async def wait_held(self, replica: int, timeout: float) -> bool:
        """Arm `replica` and wait up to `timeout` seconds for it to be held mid-put (`landed`). True once it is:
        then a kill of its process (FaultSpec.mid_put) cuts the held claim with some groups on the bus, not all."""
        self.armed.add(replica)
        try:
            await asyncio.wait_for(self.held[replica].wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return replica in self.held and self.held[replica].is_set()

    async def open_claims(self, replica: int) -> int:
        return sum(1 for c in self.claims.values() if c["replica"] == replica)

    async def stats(self) -> dict:
        return {"generated_groups": dict(self.generated), "open_claims": len(self.claims),
                "returned": sum(len(v) for v in self.returned.values()), "draining": sorted(self.draining),
                "done_groups": dict(self.done)}


class RolloutPool(Protocol):
    """What the scaling API needs from the rollout replicas (fakes implement it in tests)."""

    def engines(self) -> list[dict]: ...  # [{engine_id, initial, status, healthy, pid, weight_version, ...}]

    def count(self) -> int: ...  # replicas serving or being added

    def create_replica(self) -> str: ...  # starts the process; returns its id

    def health_check(self, rid: str, timeout: float) -> None: ...  # raises if it does not answer

    def sync_weights(self, rid: str) -> int: ...  # newest weights from a DCS peer; returns the version

    def activate(self, rid: str) -> None: ...  # starts taking work

    def drain(self, rid: str, timeout: float) -> bool: ...  # no new work; True once in-flight work is done

    def remove(self, rid: str) -> None: ...  # stop the process, forget it

    # optional: `capacity() -> int | None`, the most replicas the cluster can hold now (None: no resource bound)


NOT_SERVING = ("REMOVED", "DRAINING", "REMOVING", "SPARE", "STARTING_SPARE")


@dataclass
class Replica:
    index: int
    handle: Any
    initial: bool
    status: str = "CREATING"
    pid: int | None = None
    future: Any = None  # the run() call while ACTIVE
    version: int = -1


class RayRolloutPool:
    """RolloutPool over RolloutRole actors. `factory(index)` creates a replica's actor; `start(handle, index)`
    starts its run loop and returns the ObjectRef the supervisor watches."""

    def __init__(self, factory: Callable[[int], Any], start: Callable[[Any, int], Any], queue, dcs=None,
                 need: dict[str, float] | None = None):
        self.factory, self.start, self.queue, self.dcs = factory, start, queue, dcs
        self.need = {k: v for k, v in (need or {}).items() if v > 0}  # Ray resources one replica takes
        self.replicas: dict[int, Replica] = {}
        self.lock = threading.RLock()
        self.next_index = 0

    @staticmethod
    def rid(index: int) -> str:
        return f"rollout-{index}"

    def _get(self, rid: str) -> Replica:
        try:
            with self.lock:
                return self.replicas[int(rid.rsplit("-", 1)[1])]
        except (KeyError, IndexError, ValueError):
            raise KeyError(f"no rollout replica '{rid}'") from None

    # -- set-up by the supervisor (at the start of a run)
    def add_initial(self, n: int) -> list[Replica]:
        made = [self._create(initial=True) for _ in range(n)]
        for r in made:
            r.pid = ray.get(r.handle.pid.remote())
            r.status = "READY"
        return made

    def _create(self, initial: bool, status: str = "CREATING") -> Replica:
        with self.lock:
            index = self.next_index
            self.next_index += 1
            rep = Replica(index, self.factory(index), initial, status)
            self.replicas[index] = rep
            return rep

    def add_spare(self) -> Replica:
        """A warm standby: started and following the weights, but taking no work until swapped in."""
        return self._create(initial=False, status="STARTING_SPARE")

    def spare(self) -> Replica | None:
        with self.lock:
            return next((r for r in self.replicas.values() if r.status == "SPARE"), None)

    def snapshot(self) -> dict[int, Replica]:
        """A copy of `replicas` taken under the lock: what every walk outside the pool iterates (the API adds
        replicas from its own thread)."""
        with self.lock:
            return dict(self.replicas)

    def capacity(self) -> int | None:
        """Replicas serving now plus those the cluster's free resources can still place."""
        if not self.need:
            return None
        free = ray.available_resources()
        more = min(int(free.get(k, 0.0) // v) for k, v in self.need.items())
        return self.count() + more

    def activate_all(self) -> None:
        for r in self.snapshot().values():
            if r.status == "READY":
                self.activate(self.rid(r.index))

    # -- RolloutPool
    def count(self) -> int:
        with self.lock:
            return sum(1 for r in self.replicas.values() if r.status not in NOT_SERVING)

    def create_replica(self) -> str:
        return self.rid(self._create(initial=False).index)

    def health_check(self, rid: str, timeout: float) -> None:
        rep = self._get(rid)
        rep.status = "HEALTH_CHECKING"
        ray.get(rep.handle.ready.remote(), timeout=timeout)
        rep.pid = ray.get(rep.handle.pid.remote(), timeout=timeout)

    def sync_weights(self, rid: str) -> int:
        rep = self._get(rid)
        rep.status = "WEIGHT_SYNCING"
        latest = self.dcs.topology()["latest"] if self.dcs is not None else 0
        ray.get(rep.handle.sync_weights.remote(min_version=latest))
        rep.version = ray.get(rep.handle.weight_version.remote())
        rep.status = "READY"
        return rep.version

    def activate(self, rid: str) -> None:
        rep = self._get(rid)
        with self.lock:
            rep.future = self.start(rep.handle, rep.index)
            rep.status = "ACTIVE"

    def drain(self, rid: str, timeout: float) -> bool:
        rep = self._get(rid)
        rep.status = "DRAINING"
        ray.get(self.queue.drain.remote(rep.index))
        if rep.future is None:
            return True
        done, _ = ray.wait([rep.future], timeout=timeout)
        return bool(done)

    def remove(self, rid: str) -> None:
        rep = self._get(rid)
        rep.status = "REMOVING"
        ray.kill(rep.handle)
        wait_exited([(rep.pid, rep.handle)])  # else it could still claim work after the release below
        ray.get(self.queue.release.remote(rep.index))  # a forced removal hands its open claim out again
        if self.dcs is not None and rep.pid is not None:
            for m in self.dcs.topology()["members"]:
                if m["pid"] == rep.pid and m["alive"]:
                    self.dcs.mark_dead(m["id"])
        with self.lock:
            rep.status = "REMOVED"
            rep.future = None

    # -- for the supervisor and /rollout/engines
    def futures(self) -> dict:
        with self.lock:
            return {r.future: r.index for r in self.replicas.values() if r.future is not None}

    def finished(self, index: int) -> None:
        """The replica's run loop returned (no work left, or it was drained)."""
        with self.lock:
            rep = self.replicas[index]
            rep.future = None
            if rep.status == "ACTIVE":
                rep.status = "IDLE"

    def replace(self, index: int, handle, pid: int) -> None:
        """The supervisor restarted a dead replica in place (same index)."""
        with self.lock:
            rep = self.replicas[index]
            rep.handle, rep.pid = handle, pid
            rep.future = self.start(handle, index)
            rep.status = "ACTIVE"

    def handles(self) -> dict[int, Any]:
        with self.lock:
            return {i: r.handle for i, r in self.replicas.items() if r.status not in ("REMOVED",)}

    def engines(self) -> list[dict]:
        stats = ray.get(self.queue.stats.remote())
        beats = {}
        if self.dcs is not None:
            for m in self.dcs.topology()["members"]:
                if m["alive"] and m["role"] == "rollout":
                    beats[m["pid"]] = m
        out = []
        with self.lock:
            for r in self.replicas.values():
                if r.status in ("REMOVED", "SPARE", "STARTING_SPARE"):
                    continue
                m = beats.get(r.pid)
                out.append({"engine_id": self.rid(r.index), "initial": r.initial, "status": r.status, "pid": r.pid,
                            "is_healthy": healthy(m),
                            "weight_version": max(m["holds"], default=r.version) if m else r.version,
                            "groups_generated": stats["generated_groups"].get(r.index, 0)})
        return out
