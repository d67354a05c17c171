"""DCS, the distributed checkpoint service: versioned weights that move between roles without disk.

One coordinator (a named async Ray actor) keeps the topology and the metadata; every role holds a client.

* Coordinator: members register (role, replica, pid) and heartbeat; each version is published with its
  metadata (tensor names, shapes, dtypes, bucket layout) and the ids of the samples trained to make it;
  it records which live member holds which version and pairs a receiver with a holder for each transfer.
* Transfer (`transport: gloo`): a holder copies its weights into flat per-dtype buckets (the staging, allocated
  once and reused for every version) and a serving thread answers transfer sessions: a two-rank
  torch.distributed process group per (holder, receiver) pair (gloo on CPU tensors, NCCL when the staging
  lives on a GPU: same code) moves the staging bucket by bucket with `broadcast`. The group is made on the
  pair's first session and reused for every later version (`reuse_groups`; the coordinator names it, and a
  failed session retires it, so both sides make a new one next time). A receiver receives into its own
  staging and becomes a holder too, so a restarted or added role pulls the current weights from a live peer,
  never from disk.
* Publishing (the Actor) only copies parameters into the staging and announces the version (milliseconds);
  the transfers to rollout engines run in the serving thread while the next training step runs.
* A rollout engine *follows*: a background thread pulls each new version into the staging while the engine
  generates; the engine pauses only to copy the staging into its parameters between generate calls.
* The driver is a member too: it pins version 0 (the reference policy) and follows the newest version, so
  every version is held by a second process once published (a killed Actor loses nothing published).
* Ledger: a version is *committed* once a member other than its publisher holds it; the sample ids trained
  for it count as trained only then (`ledger()`), which is what makes "every sample trained exactly once"
  hold across an Actor failure: a version that died with the Actor rolls back with its samples.
* `transport: object_store` keeps the first version's data path (Ray object store: `ray.put` by the
  publisher, `ray.get` by receivers) behind the same interface, for comparison.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from datetime import timedelta

import ray
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

NAME = "relax_dcs"
NAMESPACE = "relax"
STALE_S = 2.0  # a member silent this long is the last choice as a holder
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool}


# ---- layout and staging ------------------------------------------------------------------------------------
def plan_layout(tensors: dict[str, torch.Tensor], bucket_bytes: int) -> list[dict]:
    """Buckets of consecutive same-dtype tensors, each at most `bucket_bytes` (a bigger tensor gets its own).

    A bucket is {"dtype", "numel", "entries": [(name, offset, numel, shape)]}; it is the unit of transfer."""
    if bucket_bytes <= 0:
        raise ValueError(f"dcs: bucket size must be positive (got {bucket_bytes} bytes)")
    buckets: list[dict] = []
    cur: dict | None = None
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"dcs: tensor '{name}' has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        if cur is None or cur["dtype"] != dtype or (cur["entries"] and cur["bytes"] + nbytes > bucket_bytes):
            cur = {"dtype": dtype, "numel": 0, "bytes": 0, "entries": []}
            buckets.append(cur)
        cur["entries"].append((name, cur["numel"], t.numel(), tuple(t.shape)))
        cur["numel"] += t.numel()
        cur["bytes"] += nbytes
    return buckets


def layout_bytes(layout: list[dict]) -> int:
    return sum(b["bytes"] for b in layout)


class Staging:
    """Flat buckets holding one version of the weights; allocated once per layout and reused."""

    def __init__(self, layout: list[dict], device: str = "cpu"):
        self.layout = layout
        self.device = device
        self.buffers = [torch.empty(b["numel"], dtype=DTYPES[b["dtype"]], device=device) for b in layout]
        self.version = -1
        self.nbytes = layout_bytes(layout)
        self.lock = threading.RLock()

    def matches(self, layout: list[dict]) -> bool:
        return self.layout == layout

    def views(self) -> dict[str, torch.Tensor]:
        """name -> tensor view into the buckets (valid until the staging is written again)."""
        out = {}
        for buf, b in zip(self.buffers, self.layout):
            for name, off, n, shape in b["entries"]:
                out[name] = buf[off : off + n].view(shape)
        return out

    @torch.no_grad()
    def fill(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        for buf, b in zip(self.buffers, self.layout):
            for name, off, n, shape in b["entries"]:
                buf[off : off + n].copy_(tensors[name].detach().reshape(-1))
        self.version = version


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unit of weight sync: named parameters (tied weights once), as every loader expects them."""
    return {name: p.detach() for name, p in model.named_parameters()}


# ---- process groups ------------------------------------------------------------------------------------------
def _device_of(staging_device: str) -> str:
    return "cuda" if staging_device.startswith("cuda") else "cpu"


def make_pair_group(store, name: str, rank: int, timeout_s: float, device: str, host: str):
    """A two-rank process group for one transfer session: gloo for CPU staging, NCCL for GPU staging."""
    prefixed = dist.PrefixStore(f"dcs/{name}/", store)
    timeout = timedelta(seconds=timeout_s)
    if device == "cuda":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("dcs: staging is on a GPU but this torch build has no NCCL")
        return nccl(prefixed, rank, 2)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = timeout
    return dist.ProcessGroupGloo(prefixed, rank, 2, opts)


def broadcast_buckets(pg, buffers: list[torch.Tensor], root: int) -> None:
    """Move every bucket from `root` to the other rank; the bucket calls are queued back to back."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    works = [pg.broadcast([buf], opts) for buf in buffers]
    for w in works:
        w.wait()


# ---- coordinator ---------------------------------------------------------------------------------------------
@ray.remote(num_cpus=0, max_concurrency=1000)
class DCSCoordinator:
    """Topology, versions, the ledger and the pairing of receivers with holders (see the module doc)."""

    def __init__(self, transport: str, host: str, reuse_groups: bool = True):
        self.transport = transport
        self.host = host
        self.reuse_groups = reuse_groups
        self.pair_group: dict[tuple[str, str], str] = {}  # (holder, receiver) -> name of their process group
        self.store = None
        if transport == "gloo":
            self.store = dist.TCPStore(host, 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
        self.members: dict[str, dict] = {}
        self.holds: dict[str, set[int]] = defaultdict(set)  # member -> versions it can serve now
        self.layouts: dict[int, list[dict]] = {}
        self.refs: dict[int, list] = {}  # object_store transport: version -> [ObjectRef]
        self.publisher: dict[int, str] = {}
        self.pending: dict[int, list[int]] = {}  # version -> sample ids, until committed
        self.committed: dict[int, list[int]] = {}
        self.latest = -1
        self.sessions: dict[str, dict] = {}
        self.queues: dict[str, asyncio.Queue] = {}
        self.changed = asyncio.Condition()
        self.stats = {"transfers": 0, "bytes": 0, "seconds": 0.0, "failed": 0}

    # -- membership
    async def register(self, role: str, replica: int | None, pid: int, serve: bool, trainer: bool = False) -> dict:
        mid = f"{role}{'' if replica is None else f'-{replica}'}-{uuid.uuid4().hex[:6]}"
        self.members[mid] = {"id": mid, "role": role, "replica": replica, "pid": pid, "serve": serve,
                             "trainer": trainer, "alive": True, "registered": time.time(), "last_seen": time.time()}
        self.queues[mid] = asyncio.Queue()
        return {"id": mid, "store": (self.host, self.store.port) if self.store is not None else None,
                "transport": self.transport}

    async def heartbeat(self, mid: str) -> bool:
        m = self.members.get(mid)
        if m is None or not m["alive"]:
            return False
        m["last_seen"] = time.time()
        return True

    async def mark_dead(self, mid: str) -> None:
        """A member is gone (the health manager saw its process die): it serves nothing any more."""
        async with self.changed:
            m = self.members.get(mid)
            if m is None or not m["alive"]:
                return
            m["alive"] = False
            self.holds.pop(mid, None)
            for pair in [p for p in self.pair_group if mid in p]:
                del self.pair_group[pair]
            for s in self.sessions.values():
                if s["state"] in ("queued", "accepted") and mid in (s["src"], s["dst"]):
                    s["state"] = "failed"
            if m["trainer"]:
                self._rollback_to_reachable()
            self.changed.notify_all()

    def _alive(self, mid: str) -> bool:
        m = self.members.get(mid)
        return m is not None and m["alive"]

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
        for v in sorted(self.pending):
            holders = [m for m, vs in self.holds.items() if self._alive(m) and any(x >= v for x in vs)
                       and m != self.publisher.get(v)]
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

    async def wait_newer(self, have: int, timeout: float) -> int:
        """The newest version once one newer than `have` exists (or `have` after `timeout`)."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.latest > have), timeout)
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
        cands.sort(key=lambda m: (now - self.members[m]["last_seen"] > STALE_S, busy[m], self.members[m]["trainer"]))
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
            "members": [{**m, "holds": sorted(self.holds.get(mid, ())), "heartbeat_age_s": round(now - m["last_seen"], 3)}
                        for mid, m in self.members.items()],
            "stats": dict(self.stats),
        }

    async def ledger(self) -> list[int]:
        """Sample ids of every committed version, in version order (the exactly-once account)."""
        return [s for v in sorted(self.committed) for s in self.committed[v]]


# ---- client ----------------------------------------------------------------------------------------------------
class DCS:
    """The handle every role gets (it pickles; each process opens its own client lazily).

    Role side: `join(role, replica, serve, follow, trainer)` registers and starts the heartbeat (plus the
    serving / following threads); `sync(have, load, min_version=, exact=)` brings a newer version in and calls
    `load(state, version)`; `publish(version, tensors, sample_ids=)` makes a version available.
    """

    def __init__(self, transport: str = "gloo", bucket_mb: float = 64.0, timeout_s: float = 60.0,
                 heartbeat_s: float = 0.5, device: str = "cpu", reuse_groups: bool = True):
        if transport not in ("gloo", "object_store"):
            raise ValueError(f"dcs.transport: unknown transport '{transport}' (gloo | object_store)")
        self.transport = transport
        self.reuse_groups = reuse_groups
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.device = device
        self._coord = None
        self._reset_local()

    def __reduce__(self):
        return (DCS, (self.transport, self.bucket_bytes / 2**20, self.timeout_s, self.heartbeat_s, self.device,
                      self.reuse_groups))

    def _reset_local(self) -> None:
        self.id: str | None = None
        self.role = None
        self.staging: Staging | None = None  # the current version (served; loaded from)
        self.pinned: Staging | None = None  # a version kept for good (the driver pins version 0)
        self.obj_state: tuple[int, dict] | None = None  # object_store: the last version fetched
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._newer = threading.Condition()
        self._store_addr = None
        self._tls = threading.local()
        self._pull_lock = threading.Lock()
        self._following = False
        self._groups: dict[tuple[str, int], tuple[str, object]] = {}  # (peer, my rank) -> (group name, group)
        self.groups_made = 0
        self.last_transfer: dict = {}

    # -- lifecycle
    @classmethod
    def start(cls, transport: str = "gloo", bucket_mb: float = 64.0, timeout_s: float = 60.0,
              heartbeat_s: float = 0.5, device: str = "cpu", reuse_groups: bool = True) -> DCS:
        """Start the coordinator (driver, after ray.init) and return a handle for the roles."""
        try:
            ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            pass
        else:
            raise RuntimeError(f"DCS.start: {NAMESPACE}/{NAME} is already running; close the previous one first")
        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        coord = DCSCoordinator.options(name=NAME, namespace=NAMESPACE).remote(transport, host, reuse_groups)
        ray.get(coord.topology.remote())
        dcs = cls(transport, bucket_mb, timeout_s, heartbeat_s, device, reuse_groups)
        dcs._coord = coord
        return dcs

    @property
    def coord(self):
        if self._coord is None:
            self._coord = ray.get_actor(NAME, namespace=NAMESPACE)
        return self._coord

    def join(self, role: str, replica: int | None = None, *, serve: bool = False, follow: bool = False,
             trainer: bool = False) -> str:
        """Register this process; start its heartbeat (and serving / following threads)."""
        if self.id is not None:
            return self.id
        info = ray.get(self.coord.register.remote(role, replica, os.getpid(), serve, trainer))
        self.id, self.role, self._store_addr = info["id"], role, info["store"]
        self._stop.clear()
        self._spawn(self._heartbeat_loop, "dcs-heartbeat")
        if serve and self.transport == "gloo":
            self._spawn(self._serve_loop, "dcs-serve")
        if follow:
            self._following = True
            self._spawn(self._follow_loop, "dcs-follow")
        return self.id

    def leave(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        if self.id is not None:
            try:
                ray.get(self.coord.mark_dead.remote(self.id))
            except Exception:  # the coordinator may already be gone at teardown
                pass
        self._reset_local()

    def close(self) -> None:
        """Driver: leave and stop the coordinator."""
        self.leave()
        if self._coord is not None:
            ray.kill(self._coord)
            self._coord = None

    def _spawn(self, fn, name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.coord.heartbeat.remote(self.id)
            except Exception:
                return

    def _store(self):
        """A TCPStore client per thread (store clients are not shared between threads)."""
        st = getattr(self._tls, "store", None)
        if st is None:
            host, port = self._store_addr
            st = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=self.timeout_s))
            self._tls.store = st
        return st

    def _group(self, sess: dict, rank: int):
        """The process group of this session's pair: the cached one while the coordinator names the same group,
        else a new one (made on both sides by the same name: a rendezvous through the coordinator's store)."""
        peer = sess["dst"] if rank == 0 else sess["src"]
        got = self._groups.get((peer, rank))
        if got is not None and got[0] == sess["group"]:
            return got[1]
        pg = make_pair_group(self._store(), sess["group"], rank, self.timeout_s, _device_of(self.device),
                             self._store_addr[0])
        self.groups_made += 1
        self._groups[(peer, rank)] = (sess["group"], pg)
        return pg

    def _drop_group(self, sess: dict, rank: int) -> None:
        peer = sess["dst"] if rank == 0 else sess["src"]
        self._groups.pop((peer, rank), None)

    # -- publishing
    def have(self) -> int:
        versions = [s.version for s in (self.staging, self.pinned) if s is not None]
        if self.obj_state is not None:
            versions.append(self.obj_state[0])
        return max(versions, default=-1)

    def publish(self, version: int, tensors: dict[str, torch.Tensor], sample_ids: list[int] | None = None,
                pin: bool = False) -> float:
        """Make `version` available: copy into the staging and announce it. Returns seconds spent here."""
        t0 = time.perf_counter()
        if self.id is None:
            raise RuntimeError("dcs: join() before publish()")
        if self.transport == "object_store":
            ref = ray.put({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()})
            ray.get(self.coord.announce.remote(self.id, version, None, sample_ids, [ref]))
            return time.perf_counter() - t0
        layout = plan_layout(tensors, self.bucket_bytes)
        slot = "pinned" if pin else "staging"
        st = getattr(self, slot)
        if st is None or not st.matches(layout):
            st = Staging(layout, self.device)
            setattr(self, slot, st)
        with st.lock:  # waits for a transfer being served from the previous version
            old = st.version
            if old >= 0:
                ray.get(self.coord.release.remote(self.id, old))
            st.fill(tensors, version)
        ray.get(self.coord.announce.remote(self.id, version, layout, sample_ids))
        return time.perf_counter() - t0

    def wait_committed(self, version: int, timeout: float | None = None) -> bool:
        return ray.get(self.coord.wait_committed.remote(version, timeout))

    # -- receiving
    def sync(self, have: int, load, min_version: int | None = None, exact: int | None = None,
             block: bool = True) -> int:
        """Bring in a version newer than `have` (or exactly `exact`) and call `load(state, version)` with it;
        returns the version loaded, or `have` if there was nothing to do. `min_version` waits for that version
        to exist; `block=False` only loads what is already here (a follower's prefetched version)."""
        if self.transport == "object_store":
            return self._sync_object_store(have, load, min_version, exact, block)
        if self._following and exact is None:
            # The follow thread brings versions in; wait for one new enough, then copy it in.
            if block and min_version is not None:
                limit = self.timeout_s * 5
                with self._newer:
                    if not self._newer.wait_for(lambda: self._staged() >= min_version, timeout=limit):
                        raise TimeoutError(f"dcs: version >= {min_version} did not arrive within {limit} s")
        elif block:
            self._pull(min_version, exact)
        st = self.staging
        if st is None or not st.lock.acquire(blocking=block):
            return have
        try:
            fresh = st.version == exact and have != exact if exact is not None else st.version > have
            if not fresh:
                return have
            load(st.views(), st.version)
            return st.version
        finally:
            st.lock.release()

    def _staged(self) -> int:
        return self.staging.version if self.staging is not None else -1

    def _sync_object_store(self, have, load, min_version, exact, block) -> int:
        if not block:
            return have
        sess = ray.get(self.coord.request.remote(self.id, have, min_version, exact, None, self.timeout_s * 5))
        if sess is None:
            return have
        state = ray.get(sess["refs"][0])
        self.obj_state = (sess["version"], state)
        ray.get(self.coord.announce.remote(self.id, sess["version"]))
        load(state, sess["version"])
        return sess["version"]

    def _pull(self, min_version: int | None, exact: int | None, timeout: float | None = None) -> int | None:
        """Receive a newer version (or `exact`) into the staging from a live holder, retrying another holder
        if one fails mid-transfer. Returns the version received, or None if nothing was needed."""
        exclude: list[str] = []
        with self._pull_lock:
            for _ in range(6):
                have = self._staged()
                sess = ray.get(self.coord.request.remote(self.id, have, min_version, exact, exclude,
                                                         timeout if timeout is not None else self.timeout_s * 5))
                if sess is None:
                    return None
                ok = False
                t0 = time.perf_counter()
                try:
                    if not ray.get(self.coord.await_accept.remote(sess["sid"], min(10.0, self.timeout_s))):
                        raise RuntimeError(f"holder {sess['src']} did not take the session")
                    st = self.staging
                    if st is None or not st.matches(sess["layout"]):
                        st = Staging(sess["layout"], self.device)
                    with st.lock:
                        if st.version >= 0:  # stop serving what is about to be overwritten
                            # Not awaited: a receiver paired with the old version meanwhile is refused by the
                            # serve loop (version -1 below) and retries elsewhere; the round trip stays off
                            # the transfer.
                            self.coord.release.remote(self.id, st.version)
                        st.version = -1
                        broadcast_buckets(self._group(sess, 1), st.buffers, root=0)
                        st.version = sess["version"]
                        self.staging = st
                    ok = True
                except Exception as err:  # the holder died or stalled: try another one
                    log.warning("dcs: transfer of version %s from %s failed (%s); retrying",
                                sess["version"], sess["src"], err)
                    self._drop_group(sess, 1)
                    exclude.append(sess["src"])
                finally:
                    seconds = time.perf_counter() - t0
                    ray.get(self.coord.finish.remote(sess["sid"], ok, seconds))
                if ok:
                    self.last_transfer = {"version": sess["version"], "src": sess["src"], "seconds": seconds,
                                          "bytes": sess["bytes"], "groups_made": self.groups_made}
                    ray.get(self.coord.announce.remote(self.id, sess["version"]))
                    with self._newer:
                        self._newer.notify_all()
                    return sess["version"]
        raise RuntimeError(f"dcs: could not fetch a version newer than {have} (failed holders: {exclude})")

    # -- background threads
    def _serve_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sess = ray.get(self.coord.next_session.remote(self.id, 1.0))
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.5)
                continue
            if sess is None:
                continue
            st = next((s for s in (self.staging, self.pinned) if s is not None and s.version == sess["version"]), None)
            try:
                if st is None:
                    raise RuntimeError(f"version {sess['version']} is no longer held here")
                with st.lock:
                    if st.version != sess["version"] or not st.matches(sess["layout"]):
                        raise RuntimeError(f"version {sess['version']} was replaced while queued")
                    broadcast_buckets(self._group(sess, 0), st.buffers, root=0)
            except Exception as err:
                log.warning("dcs: serving version %s to %s failed: %s", sess["version"], sess["dst"], err)
                self._drop_group(sess, 0)
                try:
                    ray.get(self.coord.finish.remote(sess["sid"], False))
                except Exception:
                    pass

    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            try:
                have = self.have()
                latest = ray.get(self.coord.wait_newer.remote(have, 1.0))
                if latest > have:
                    self._pull(None, None, timeout=2.0)
            except TimeoutError:
                continue
            except Exception as err:
                if self._stop.is_set():
                    return
                log.warning("dcs: follow failed: %s", err)
                time.sleep(0.2)

    # -- driver helpers
    def latest_state(self, min_version: int = 0) -> tuple[int, dict[str, torch.Tensor]]:
        """(version, a copy of the newest weights, at least `min_version`) (the driver, at the end of a run)."""
        out: dict = {}

        def keep(state, version):
            out.update({k: v.clone() for k, v in state.items()})
            out["__version__"] = version

        self.sync(-1, keep, min_version=min_version)
        if "__version__" not in out:
            raise RuntimeError(f"dcs: no version >= {min_version} could be fetched")
        return out.pop("__version__"), out

    def topology(self) -> dict:
        return ray.get(self.coord.topology.remote())

    def ledger(self) -> list[int]:
        return ray.get(self.coord.ledger.remote())

    def mark_dead(self, member_id: str) -> None:
        ray.get(self.coord.mark_dead.remote(member_id))
