"""Fault injection for experiments and tests: real signals to a role's process.

    faults: [{role: rollout, at_step: 5, kind: kill}]

A fault fires once the Actor has finished `at_step` steps, plus `after_s` seconds (a rollout kill with
`mid_put: true` then also waits for the replica to have put part of a claim: the GroupQueue holds the replica after
the claim's first put until the kill lands, so the claim is cut between its first put and its end by design, not by
luck). The step is the Actor's own counter (it tells Telemetry as it starts each step), and the Actor does not start
step at_step + 1 before the fault has fired (ActorRole.await_faults): a fault lands in the step it names, however late
the driver looks. The one exception is a mid_put kill whose replica has had no claim for a second: the gate holds
the rollout while the Actor waits, so that moment could not come; it fires at the replica's next put instead.
  kill   SIGKILL of the role's process (no cleanup, no goodbye: the real thing)
  delay  SIGSTOP for `duration_s`, then SIGCONT (a stalled process / a network partition of that length)
  slow   for `duration_s`, the process may run only a `duty` share of each 100 ms (SIGSTOP/SIGCONT duty cycle)
  nan    (Actor only) step `at_step`'s loss is made non-finite inside the Actor (relax/roles/actor.py), as a
         numerical blow-up would; nothing is signalled, the fault is only recorded here
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)
SLOW_PERIOD_S = 0.1


class FaultInjector:
    def __init__(self, faults: list, pid_of: Callable[[object], int | None]):
        self.waiting = [{"spec": f, "due": None, "index": i} for i, f in enumerate(faults)]
        self.pid_of = pid_of
        self.fired: list[dict] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stopped_pids: set[int] = set()
        self._lock = threading.Lock()

    def tick(self, steps_done: int) -> list[dict]:
        """Fire every fault that is due; returns the ones fired now."""
        now = time.time()
        fired = []
        for w in list(self.waiting):
            spec = w["spec"]
            if steps_done < spec.at_step:
                continue
            if w["due"] is None:
                w["due"] = now + spec.after_s
            if now < w["due"]:
                continue
            pid = None if spec.kind == "nan" else self.pid_of(spec)
            if pid is None and spec.kind != "nan":
                continue  # the target is restarting, or not in its trigger's state yet; try again next tick
            self.waiting.remove(w)
            event = {"index": w["index"], "role": spec.role,
                     "replica": spec.replica if spec.role == "rollout" else None, "kind": spec.kind,
                     "at_step": spec.at_step, "steps_done": steps_done, "pid": pid, "t_fault": time.time()}
            self._fire(spec, pid)
            log.warning("fault injected: %s of %s (pid %s) after %d steps", spec.kind, spec.role, pid, steps_done)
            self.fired.append(event)
            fired.append(event)
        return fired

    def last_for(self, role: str, replica: int | None = None, pid: int | None = None) -> dict | None:
        """The newest kill of `role` (and replica; of process `pid` when given) not yet matched to a recovery."""
        for ev in reversed(self.fired):
            if ev["role"] == role and ev.get("replica") == replica and ev["kind"] == "kill" and not ev.get("matched") \
                    and (pid is None or ev["pid"] == pid):
                ev["matched"] = True
                return ev
        return None

    def unmatched_kills(self) -> list[dict]:
        """Kills fired and not yet matched to a recovery event."""
        return [ev for ev in self.fired if ev["kind"] == "kill" and not ev.get("matched")]

    @property
    def pending(self) -> bool:
        return bool(self.waiting)

    def _fire(self, spec, pid: int) -> None:
        if spec.kind == "kill":
            _signal(pid, signal.SIGKILL)
        elif spec.kind == "delay":
            self._stop_for(pid, spec.duration_s)
        elif spec.kind == "slow":
            self._spawn(self._duty_cycle, pid, spec.duration_s, spec.duty)
        elif spec.kind == "nan":
            pass  # the Actor poisons that step itself (it reads the fault from the config)
        else:
            raise ValueError(f"faults: unknown kind '{spec.kind}'")

    def _spawn(self, fn, *args) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True, name="relax-fault")
        t.start()
        self._threads.append(t)

    def _pause(self, pid: int) -> None:
        with self._lock:
            if _signal(pid, signal.SIGSTOP):
                self._stopped_pids.add(pid)

    def _resume(self, pid: int) -> None:
        with self._lock:
            _signal(pid, signal.SIGCONT)
            self._stopped_pids.discard(pid)

    def _stop_for(self, pid: int, seconds: float) -> None:
        self._pause(pid)
        self._spawn(lambda: (self._stop.wait(seconds), self._resume(pid)))

    def _duty_cycle(self, pid: int, seconds: float, duty: float) -> None:
        end = time.time() + seconds
        while time.time() < end and not self._stop.is_set():
            self._stop.wait(SLOW_PERIOD_S * duty)
            self._pause(pid)
            self._stop.wait(SLOW_PERIOD_S * (1 - duty))
            self._resume(pid)

    def stop(self) -> None:
        """End every running delay / slow fault and let every stopped process run again."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        with self._lock:
            for pid in list(self._stopped_pids):
                _signal(pid, signal.SIGCONT)
            self._stopped_pids.clear()


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
