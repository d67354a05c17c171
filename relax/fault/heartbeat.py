"""Heartbeats and liveness: who is alive, the beat each member sends, and how long a silence is tolerated.

Every process that joins the DCS beats from a background thread (`beat_until`) to the DCS coordinator,
whose registry keeps a `Liveness` record per member. Two silences matter: past `STALE_S` a member is the
last choice as a holder of weights (it may be stalled or dying); past `health.heartbeat_timeout_s` the
supervisor kills it and recovers it like any death (relax/fault/supervisor.py). A member marked dead (its
process died, or it left) stays dead: a restarted process joins as a new member.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

STALE_S = 3.0  # a member silent this long (three beats at the default health.heartbeat_s) is the last choice as a holder
HEALTHY_S = 5.0  # a rollout engine silent longer than this is reported unhealthy (GET /rollout/engines)


def healthy(member: dict | None) -> bool:
    """A DCS topology member (its `heartbeat_age_s`) that the control API reports healthy."""
    return member is not None and member["heartbeat_age_s"] < HEALTHY_S


def missed_heartbeats(member: dict, limit_s: float) -> bool:
    """A live member silent past `limit_s` (health.heartbeat_timeout_s): the supervisor kills and recovers it."""
    return member["alive"] and member["heartbeat_age_s"] > limit_s


class Liveness:
    """Per member: registered, last heartbeat seen, alive (until marked dead, for good)."""

    def __init__(self):
        self.records: dict[str, dict] = {}

    def add(self, mid: str) -> None:
        now = time.time()
        self.records[mid] = {"alive": True, "registered": now, "last_seen": now}

    def record(self, mid: str) -> dict:
        return self.records[mid]

    def alive(self, mid: str) -> bool:
        r = self.records.get(mid)
        return r is not None and r["alive"]

    def beat(self, mid: str) -> bool:
        """A heartbeat from `mid`; False if it is unknown or was marked dead (it should stop beating)."""
        if not self.alive(mid):
            return False
        self.records[mid]["last_seen"] = time.time()
        return True

    def mark_dead(self, mid: str) -> bool:
        """True if `mid` was alive until now."""
        if not self.alive(mid):
            return False
        self.records[mid]["alive"] = False
        return True

    def age(self, mid: str, now: float) -> float:
        """Seconds since `mid`'s last heartbeat."""
        return now - self.records[mid]["last_seen"]

    def stale(self, mid: str, now: float) -> bool:
        return self.age(mid, now) > STALE_S


def beat_until(stop: threading.Event, every_s: float, beat: Callable[[], object]) -> None:
    """A heartbeat thread's body: `beat()` every `every_s` until `stop`; ends quietly if a beat cannot be sent
    (the coordinator is gone: the process is being torn down)."""
    while not stop.wait(every_s):
        try:
            beat()
        except Exception:
            return


def exited(pid: int) -> bool:
    """Process `pid` of this machine is gone (or a zombie: dead, only not yet reaped)."""
    import psutil

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def wait_exited(killed: list, timeout: float = 60.0) -> None:
    """Wait until every (pid, handle) in `killed` (each already sent ray.kill) has exited: on one node its pid is
    gone; on more, the best Ray offers, its handle answering ActorDiedError. ray.kill only asks: until then the
    process may still fetch rows or claim work, so nothing it held is handed out again before this returns."""
    import ray

    deadline, one_node = time.time() + timeout, len(ray.nodes()) == 1
    for pid, handle in killed:
        while not (exited(pid) if pid is not None and one_node else _handle_dead(handle)):
            if time.time() > deadline:
                raise RuntimeError(f"a stopped role process (pid {pid}) still runs {timeout:g} s after ray.kill")
            time.sleep(0.02)


def _handle_dead(handle) -> bool:
    import ray

    try:
        ray.get(handle.pid.remote(), timeout=1)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:  # busy in a call: not known to be gone
        pass
    return False
