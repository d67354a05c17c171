"""DCS client: the handle every role holds (`join`, `publish`, `sync` / follow, `last_transfer`).

* Publishing (the Actor) only copies its parameters into the staging (relax/weights/layout.py) and announces
  the version to the coordinator (milliseconds); the transfers to rollout engines run in the serving thread
  while the next training step runs.
* A holder's serving thread answers the transfer sessions the coordinator queues for it
  (relax/weights/transport.py moves the buckets). A receiver receives into its own staging and becomes a
  holder too, so a restarted or added role pulls the current weights from a live peer, never from disk.
* A rollout engine *follows*: a background thread pulls each new version into the staging while the engine
  generates; the engine pauses only to copy the staging into its parameters between generate calls.
* Every joined process heartbeats from a background thread (relax/fault/heartbeat.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import ray
import torch

from relax.fault.heartbeat import beat_until
from relax.weights.coordinator import NAME, NAMESPACE, DCSCoordinator
from relax.weights.layout import Staging, plan_layout
from relax.weights.transport import PairGroups, object_store_get, object_store_put

log = logging.getLogger(__name__)
# How long a serving / following thread's long poll waits for news before asking again. The coordinator answers the
# moment a session is queued or a version announced, and `leave` wakes both, so this only sets the idle traffic:
# each poll is a Ray call on both sides (an idle 15-member session: 0.38 cores at 1 s, 0.32 at 5 s, most of the rest
# Ray's own per-process cost).
POLL_S = 5.0


class DCS:
    """The handle every role gets (it pickles; each process opens its own client lazily).

    Role side: `join(role, replica, serve, follow, trainer)` registers and starts the heartbeat (plus the
    serving / following threads); `sync(have, load, min_version=, exact=)` brings a newer version in and calls
    `load(state, version)`; `publish(version, tensors, sample_ids=)` makes a version available.
    """

    def __init__(self, transport: str = "gloo", bucket_mb: float = 64.0, timeout_s: float = 60.0,
                 heartbeat_s: float = 1.0, device: str = "cpu", reuse_groups: bool = True):
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
        # The durable member (the driver) receives each version into a second buffer and keeps serving the one it
        # holds until the new one is whole: its copy is what a global restart resumes from, so it never holds
        # nothing newer than the pin (a holder killed mid-transfer would otherwise cost every committed version).
        self.durable = False
        self._spare: Staging | None = None
        self.obj_state: tuple[int, dict] | None = None  # object_store: the last version fetched
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._newer = threading.Condition()
        self._pairs: PairGroups | None = None  # gloo: this process's ends of its pair groups
        self._pull_lock = threading.Lock()
        self._following = False
        self.last_transfer: dict = {}

    @property
    def groups_made(self) -> int:
        """Pair groups this process has made so far (a reused group is made once)."""
        return self._pairs.made if self._pairs is not None else 0

    # -- lifecycle
    @classmethod
    def start(cls, transport: str = "gloo", bucket_mb: float = 64.0, timeout_s: float = 60.0,
              heartbeat_s: float = 1.0, device: str = "cpu", reuse_groups: bool = True, wait: bool = True) -> DCS:
        """Start the coordinator (driver, after ray.init) and return a handle for the roles. `wait=False` returns
        while its process still starts (the first call on it waits), so the caller can start others meanwhile."""
        try:
            ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            pass
        else:
            raise RuntimeError(f"DCS.start: {NAMESPACE}/{NAME} is already running; close the previous one first")
        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        coord = DCSCoordinator.options(name=NAME, namespace=NAMESPACE).remote(transport, host, reuse_groups)
        if wait:
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
             trainer: bool = False, durable: bool = False) -> str:
        """Register this process; start its heartbeat (and serving / following threads). `durable`: this member
        outlives a global restart (the driver), so only its copy commits a version."""
        if self.id is not None:
            return self.id
        info = ray.get(self.coord.register.remote(role, replica, os.getpid(), serve, trainer, durable))
        self.id, self.role, self.durable = info["id"], role, durable
        if info["store"] is not None:
            self._pairs = PairGroups(info["store"], self.timeout_s, self.device,
                                     abandoned=lambda sess: ray.get(self.coord.abandoned.remote(sess["sid"])))
        self._stop.clear()
        self._spawn(beat_until, "dcs-heartbeat", self._stop, self.heartbeat_s, self._beat)
        if serve and self.transport == "gloo":
            self._spawn(self._serve_loop, "dcs-serve")
        if follow:
            self._following = True
            self._spawn(self._follow_loop, "dcs-follow")
        return self.id

    def leave(self) -> None:
        self._stop.set()
        if self.id is not None and self._threads:
            try:
                ray.get(self.coord.wake.remote(self.id), timeout=10)  # its long polls return now
            except Exception:  # the coordinator may already be gone at teardown: the polls time out instead
                pass
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

    def _spawn(self, fn, name: str, *args) -> None:
        t = threading.Thread(target=fn, args=args, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _beat(self) -> None:
        self.coord.heartbeat.remote(self.id)

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
            refs = object_store_put(tensors)
            ray.get(self.coord.announce.remote(self.id, version, None, sample_ids, refs))
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
                    if not self._newer.wait_for(lambda: self.staged_version() >= min_version, timeout=limit):
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

    def staged_version(self) -> int:
        """The version in this member's staging: the newest one it has brought in (-1: none yet)."""
        return self.staging.version if self.staging is not None else -1

    def _sync_object_store(self, have, load, min_version, exact, block) -> int:
        if not block:
            return have
        sess = ray.get(self.coord.request.remote(self.id, have, min_version, exact, None, self.timeout_s * 5))
        if sess is None:
            return have
        state = object_store_get(sess["refs"])
        self.obj_state = (sess["version"], state)
        ray.get(self.coord.announce.remote(self.id, sess["version"]))
        load(state, sess["version"])
        return sess["version"]

    def _pull(self, min_version: int | None, exact: int | None, timeout: float | None = None) -> int | None:
        """Receive a newer version (or `exact`) into the staging from a live holder, retrying another holder
        if one fails mid-transfer. Returns the version received, or None if nothing was needed.

        A holder that fails mid-transfer is not asked again. One that does not take the session is only busy (its
        serve thread may be sending to a receiver that just died, until that transfer times out): the others are
        asked first, and when none has the version it is asked again, until the request's timeout."""
        exclude: list[str] = []  # failed mid-transfer
        busy: list[str] = []  # did not take a session
        wait = timeout if timeout is not None else self.timeout_s * 5
        deadline = time.time() + wait
        with self._pull_lock:
            failures = 0
            while failures < 6:
                have = self.staged_version()
                try:
                    sess = ray.get(self.coord.request.remote(self.id, have, min_version, exact, exclude + busy,
                                                             min(2.0, wait) if busy else wait))
                except TimeoutError:
                    if not busy or time.time() > deadline:
                        raise
                    busy.clear()  # nobody else has it: the busy holders again
                    continue
                if sess is None:
                    return None
                ok = accepted = False
                t0 = time.perf_counter()
                try:
                    if not ray.get(self.coord.await_accept.remote(sess["sid"], min(10.0, self.timeout_s))):
                        raise RuntimeError(f"holder {sess['src']} did not take the session")
                    accepted = True
                    held = self.staging
                    st = self._receive_buffer(sess["layout"])
                    with st.lock:
                        if st is held and st.version >= 0:  # stop serving what is about to be overwritten
                            # Not awaited: a receiver paired with the old version meanwhile is refused by the
                            # serve loop (version -1 below) and retries elsewhere; the round trip stays off
                            # the transfer.
                            self.coord.release.remote(self.id, st.version)
                        st.version = -1
                        self._pairs.receive(sess, st.buffers)
                        st.version = sess["version"]
                        self.staging = st
                    ok = True
                except Exception as err:  # the holder died or stalled: try another one
                    log.warning("dcs: transfer of version %s from %s failed (%s); retrying",
                                sess["version"], sess["src"], err)
                    self._pairs.drop(sess, 1)
                    if accepted or time.time() > deadline:
                        exclude.append(sess["src"])
                        failures += 1
                    else:
                        busy.append(sess["src"])
                finally:
                    seconds = time.perf_counter() - t0
                    ray.get(self.coord.finish.remote(sess["sid"], ok, seconds))
                if ok:
                    self.last_transfer = {"version": sess["version"], "src": sess["src"], "seconds": seconds,
                                          "bytes": sess["bytes"], "groups_made": self.groups_made}
                    ray.get(self.coord.announce.remote(self.id, sess["version"]))
                    if held is not None and held is not st:  # durable: the old version goes only now
                        ray.get(self.coord.release.remote(self.id, held.version))
                        self._spare = held
                    with self._newer:
                        self._newer.notify_all()
                    return sess["version"]
        raise RuntimeError(f"dcs: could not fetch a version newer than {have} (failed holders: {exclude})")

    def _receive_buffer(self, layout) -> Staging:
        """Where the next version is received: the staging itself, or (durable member) the spare buffer, leaving
        the held version whole and served until the new one has arrived."""
        st = self.staging
        if self.durable and st is not None and st.version >= 0:
            st = self._spare
        if st is None or not st.matches(layout):
            st = Staging(layout, self.device)
        return st

    # -- background threads
    def _serve_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sess = ray.get(self.coord.next_session.remote(self.id, POLL_S))
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
                    self._pairs.send(sess, st.buffers)
            except Exception as err:
                log.warning("dcs: serving version %s to %s failed: %s", sess["version"], sess["dst"], err)
                self._pairs.drop(sess, 0)
                try:
                    ray.get(self.coord.finish.remote(sess["sid"], False))
                except Exception:
                    pass

    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            try:
                have = self.have()
                latest = ray.get(self.coord.wait_newer.remote(have, POLL_S, self.id))
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
