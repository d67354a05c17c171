"""DCS coordinator: the one named async Ray actor that keeps the topology and the metadata of every version.

* Registry: members register (role, replica, pid, whether they serve, whether they are the trainer) and
  heartbeat (liveness: relax/fault/heartbeat.py).
* Versions: each is published with its metadata (tensor names, shapes, dtypes, bucket layout:
  relax/weights/layout.py) and the ids of the samples trained to make it; the coordinator records which live
  member holds which version.
* Pairing: it pairs a receiver with a holder for each transfer session, and names the pair's process group
  (reused for every later version while `reuse_groups`; a failed session retires it).
* Ledger: a version is *committed* once a member other than its publisher holds it (the durable member, the
  driver, when one joined: the one copy a global restart keeps); the sample ids trained
  for it count as trained only then (`ledger()`). A version that died with the trainer rolls back with its
  samples, which is what makes "every sample trained exactly once" hold across an Actor failure.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import ray

from relax.fault.heartbeat import Liveness
from relax.weights.layout import layout_bytes
from relax.weights.transport import store

NAME = "relax_dcs"
NAMESPACE = "relax"


@ray.remote(num_cpus=0, max_concurrency=1000)
class DCSCoordinator:
    """Registry, versions, the ledger and the pairing of receivers with holders (see the module doc)."""

    def __init__(self, transport: str, host: str, reuse_groups: bool = True):
        self.transport = transport
        self.host = host
        self.reuse_groups = reuse_groups
        self.pair_group: dict[tuple[str, str], str] = {}  # (holder, receiver) -> name of their process group
        self.store = None
        if transport == "gloo":
            self.store = store(host, 0, master=True, timeout_s=60, wait_for_workers=False)
        self.members: dict[str, dict] = {}  # member -> what it is (id, role, replica, pid, serve, trainer)
        self.live = Liveness()
        self.holds: dict[str, set[int]] = defaultdict(set)  # member -> versions it can serve now
        self.layouts: dict[int, list[dict]] = {}
        self.refs: dict[int, list] = {}  # object_store transport: version -> [ObjectRef]
        self.publisher: dict[int, str] = {}
        self.pending: dict[int, list[int]] = {}  # version -> sample ids, until committed
        self.committed: dict[int, list[int]] = {}
        self.latest = -1
        self.sessions: dict[str, dict] = {}
        self.queues: dict[str, asyncio.Queue] = {}
        self.woken: set[str] = set()  # members leaving: their long polls return at once
        self.changed = asyncio.Condition()
        self.stats = {"transfers": 0, "bytes": 0, "seconds": 0.0, "failed": 0}

    # -- membership
    async def register(self, role: str, replica: int | None, pid: int, serve: bool, trainer: bool = False,
                       durable: bool = False) -> dict:
        mid = f"{role}{'' if replica is None else f'-{replica}'}-{uuid.uuid4().hex[:6]}"
        self.members[mid] = {"id": mid, "role": role, "replica": replica, "pid": pid, "serve": serve,
                             "trainer": trainer, "durable": durable}
        self.live.add(mid)
        self.queues[mid] = asyncio.Queue()
        return {"id": mid, "store": (self.host, self.store.port) if self.store is not None else None,
                "transport": self.transport}

    async def heartbeat(self, mid: str) -> bool:
        return self.live.beat(mid)

    async def wake(self, mid: str) -> None:
        """`mid` is leaving: its serving and following long polls return now, not at their timeout."""
        async with self.changed:
            self.woken.add(mid)
            q = self.queues.get(mid)
            if q is not None:
                q.put_nowait(None)
            self.changed.notify_all()

    async def mark_dead(self, mid: str) -> None:
        """A member is gone (the health manager saw its process die): it serves nothing any more."""
        async with self.changed:
            if not self.live.mark_dead(mid):
                return
            self.holds.pop(mid, None)
            for pair in [p for p in self.pair_group if mid in p]:
                del self.pair_group[pair]
            for s in self.sessions.values():
                if s["state"] in ("queued", "accepted") and mid in (s["src"], s["dst"]):
                    s["state"] = "failed"
            # The trainer died, or a holder died while no trainer lives (a global restart stopping every role):
            # versions nobody alive holds any more are gone, so a new trainer may publish them again.
            if self.members[mid]["trainer"] or not any(m["trainer"] and self._alive(i) for i, m in self.members.items()):
                self._rollback_to_reachable()
            self.changed.notify_all()

    def _alive(self, mid: str) -> bool:
        return self.live.alive(mid)

    def _reachable(self) -> int:
        return max((v for mid, vs in self.holds.items() if self._alive(mid) for v in vs), default=-1)

    def _rollback_to_reachable(self) -> None:
        """The trainer died: versions no live member holds are gone, and so is their ledger entry."""
        r = self._reachable()
        for v in [v for v in self.pending if v > r]:
            del self.pending[v]
        for d in (self.layouts, self.refs, self.publisher):
            for v in [v for v in d if v > r]:
                del d[v]
        self.latest = r

    # -- versions
    async def announce(self, mid: str, version: int, layout: list[dict] | None = None,
                       sample_ids: list[int] | None = None, refs: list | None = None) -> None:
        """`mid` now holds `version` (a publisher passes the layout and the trained sample ids)."""
        async with self.changed:
            if not self._alive(mid):
                raise RuntimeError(f"dcs: member {mid} is not registered or was marked dead")
            if layout is not None or refs is not None:
                if version in self.publisher and self.publisher[version] != mid:
                    raise ValueError(f"dcs: version {version} was already published by {self.publisher[version]}")
                self.publisher[version] = mid
                if layout is not None:
                    self.layouts[version] = layout
                if refs is not None:
                    self.refs[version] = refs
                if sample_ids is not None:
                    self.pending[version] = list(sample_ids)
                self.latest = max(self.latest, version)
            self.holds[mid].add(version)
            self._commit()
            self.changed.notify_all()

    async def release(self, mid: str, version: int) -> None:
        """`mid` stops serving `version` (its staging is about to be overwritten)."""
        async with self.changed:
            self.holds.get(mid, set()).discard(version)
            # Sessions queued on it for that version cannot be served: fail them now (their receivers pick
            # another holder at once instead of waiting on a transfer that will not come).
            for s in self.sessions.values():
                if s["src"] == mid and s["version"] == version and s["state"] == "queued":
                    s["state"] = "failed"
            self.changed.notify_all()

    def _commit(self) -> None:
        # With a durable member (the driver, which outlives a global restart) only its copy commits: a version
        # held by roles alone dies with them in a global restart, and its samples must be trained again.
        durable = {m for m, info in self.members.items() if info.get("durable") and self._alive(m)}
        for v in sorted(self.pending):
            holders = [m for m, vs in self.holds.items() if self._alive(m) and any(x >= v for x in vs)
                       and m != self.publisher.get(v) and (not durable or m in durable)]
            if not holders and self.transport == "gloo":
                break
            self.committed[v] = self.pending.pop(v)

    async def wait_committed(self, version: int, timeout: float | None = None) -> bool:
        if version in self.committed:
            return True
        if timeout is not None and timeout <= 0:
            return False
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: version in self.committed), timeout)
                return True
            except asyncio.TimeoutError:
                return False

    async def wait_newer(self, have: int, timeout: float, mid: str | None = None) -> int:
        """The newest version once one newer than `have` exists (or `have` after `timeout`, or once `mid` is
        leaving)."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.latest > have or mid in self.woken), timeout)
            except asyncio.TimeoutError:
                pass
            return max(self.latest, have)

    def _pick(self, mid: str, have: int, min_version: int | None, exact: int | None, exclude: set[str]):
        """(holder, version) for a receiver, or None. Prefers the least busy holder, then non-trainers."""
        if exact is not None:
            want = exact if exact != have else None
        else:
            want = max((v for m, vs in self.holds.items() if self._alive(m) and m != mid for v in vs), default=-1)
            if want <= have:
                want = None
        if want is None:
            return None
        busy = defaultdict(int)
        for s in self.sessions.values():
            if s["state"] in ("queued", "accepted"):
                busy[s["src"]] += 1
        cands = [m for m, vs in self.holds.items() if want in vs and m != mid and m not in exclude and self._alive(m)
                 and (self.transport == "object_store" or self.members[m]["serve"])]
        if not cands:
            return None
        # A holder that stopped heartbeating (stalled, or dying) is tried last; then the least busy; then
        # anyone but the trainer, whose cores are training.
        now = time.time()
        cands.sort(key=lambda m: (self.live.stale(m, now), busy[m], self.members[m]["trainer"]))
        return cands[0], want

    async def request(self, mid: str, have: int, min_version: int | None = None, exact: int | None = None,
                      exclude: list[str] | None = None, timeout: float | None = None) -> dict | None:
        """Pair `mid` with a holder of the newest version (>= min_version) or of `exact`.

        Returns None when there is nothing newer than `have` and `have` already satisfies the request;
        otherwise waits (up to `timeout`) for a holder. The receiver stops serving `have` meanwhile."""
        exclude = set(exclude or [])
        need = (exact is not None and have != exact) or (min_version is not None and have < min_version)
        async with self.changed:
            def ready():
                got = self._pick(mid, have, min_version, exact, exclude)
                if got is None:
                    return None
                if min_version is not None and got[1] < min_version:
                    return None
                return got

            got = ready()
            if got is None and not need:
                return None
            if got is None:
                try:
                    await asyncio.wait_for(self.changed.wait_for(lambda: ready() is not None), timeout)
                except asyncio.TimeoutError:
                    raise TimeoutError(
                        f"dcs: no live member holds version {'== ' + str(exact) if exact is not None else f'>= {min_version}'} "
                        f"after {timeout} s (holders: {self._holders_text()})") from None
                got = ready()
            src, version = got
            if self.transport == "object_store":
                return {"version": version, "refs": self.refs.get(version), "src": src}
            sid = uuid.uuid4().hex[:10]
            layout = self.layouts[version]
            group = self.pair_group.setdefault((src, mid), sid) if self.reuse_groups else sid
            sess = {"sid": sid, "src": src, "dst": mid, "version": version, "layout": layout, "state": "queued",
                    "created": time.time(), "bytes": layout_bytes(layout), "group": group}
            self.sessions[sid] = sess
            self.queues[src].put_nowait(sid)
            self.changed.notify_all()
            return {k: v for k, v in sess.items() if k != "state"}

    def _holders_text(self) -> str:
        return ", ".join(f"{m}:{sorted(vs)}" for m, vs in self.holds.items() if self._alive(m)) or "none"

    async def next_session(self, mid: str, timeout: float) -> dict | None:
        """A holder's serving thread takes its next session (this long poll is also its heartbeat)."""
        await self.heartbeat(mid)
        q = self.queues.get(mid)
        if q is None:
            return None
        deadline = time.time() + timeout
        while True:
            try:
                sid = await asyncio.wait_for(q.get(), max(0.0, deadline - time.time()))
            except asyncio.TimeoutError:
                return None
            if sid is None:  # woken: the member is leaving
                return None
            sess = self.sessions.get(sid)
            if sess is not None and sess["state"] == "queued":
                async with self.changed:
                    sess["state"] = "accepted"
                    self.changed.notify_all()
                return {k: v for k, v in sess.items() if k != "state"}

    async def await_accept(self, sid: str, timeout: float) -> bool:
        """The receiver waits for the holder to take the session; False (and the session fails) if it does not."""
        async with self.changed:
            sess = self.sessions[sid]
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: sess["state"] != "queued"), timeout)
            except asyncio.TimeoutError:
                sess["state"] = "failed"
            return sess["state"] == "accepted"

    async def abandoned(self, sid: str) -> bool:
        """The session failed (a peer was marked dead, or its holder never took it) or is over: its other end
        should stop waiting for the pair's rendezvous."""
        s = self.sessions.get(sid)
        return s is None or s["state"] == "failed"

    async def finish(self, sid: str, ok: bool, seconds: float = 0.0) -> None:
        async with self.changed:
            sess = self.sessions.pop(sid, None)
            if sess is None:
                return
            if ok:
                self.stats["transfers"] += 1
                self.stats["bytes"] += sess["bytes"]
                self.stats["seconds"] += seconds
            else:
                self.stats["failed"] += 1
                # The pair's group may be half-way through a collective: retire it, the next session makes anew.
                if self.pair_group.get((sess["src"], sess["dst"])) == sess["group"]:
                    del self.pair_group[(sess["src"], sess["dst"])]
            self.changed.notify_all()

    # -- views
    async def topology(self) -> dict:
        now = time.time()
        return {
            "transport": self.transport,
            "latest": self.latest,
            "reachable": self._reachable(),
            "committed": sorted(self.committed),
            "members": [{**m, **self.live.record(mid), "holds": sorted(self.holds.get(mid, ())),
                         "heartbeat_age_s": round(self.live.age(mid, now), 3)} for mid, m in self.members.items()],
            "stats": dict(self.stats),
        }

    async def ledger(self) -> list[int]:
        """Sample ids of every committed version, in version order (the exactly-once account)."""
        return [s for v in sorted(self.committed) for s in self.committed[v]]

