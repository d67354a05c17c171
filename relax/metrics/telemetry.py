"""Spans and per-step records from every role, gathered by one Telemetry actor.

Each role keeps a `SpanRecorder`; spans (role, name, start, end, step, cpu) are shipped in small batches so
the controller can compute per-role busy time for each training step and write a Chrome trace at the end.
A span's `cpu` is its process's CPU seconds over it (every thread: torch's, DCS's): beside its wall seconds it
tells a role that waited for a core (wall > cpu) from work that itself grew (cpu up, e.g. caches shared).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import ray


class SpanRecorder:
    def __init__(self, role: str, telemetry, flush_every: int = 8):
        self.role = role
        self.telemetry = telemetry
        self.flush_every = flush_every
        self.pending: list[dict] = []
        self._lock = threading.Lock()  # a streaming replica records from its put thread too (relax/roles/stream.py)
        self._depth = threading.local()

    @property
    def depth(self) -> int:
        """Spans open in this thread: only an outermost one carries `cpu` (no double count)."""
        return getattr(self._depth, "n", 0)

    @contextmanager
    def span(self, name: str, step: int | None = None, **args):
        t0, c0 = time.time(), time.process_time()
        self._depth.n = self.depth + 1
        try:
            yield args
        finally:
            self._depth.n = self.depth - 1
            self.record(name, t0, time.time(), step, cpu=time.process_time() - c0 if self.depth == 0 else 0.0,
                        **args)

    def record(self, name: str, start: float, end: float, step: int | None = None, cpu: float = 0.0,
               **args) -> None:
        """A span whose times the caller took (work that overlaps other spans of this process: a streaming
        replica's claims; `cpu` is the caller's to split so that nothing is counted twice)."""
        with self._lock:
            self.pending.append({"role": self.role, "name": name, "start": start, "end": end, "step": step,
                                 "cpu": cpu, "args": args})
            full = len(self.pending) >= self.flush_every
        if full:
            self.flush()

    def flush(self) -> None:
        """Ship the pending spans and wait until Telemetry holds them. Ray orders calls per caller only: once a
        role's call has returned, the controller (another caller) must find every span it flushed."""
        with self._lock:
            batch, self.pending = self.pending, []
        if batch and self.telemetry is not None:
            ray.get(self.telemetry.add_spans.remote(batch))


@ray.remote(num_cpus=0)
class Telemetry:
    def __init__(self):
        self.spans: list[dict] = []
        self.steps: dict[int, dict] = {}
        # Fault triggers (relax/fault/inject.py): the step the Actor is training (its own counter, set as it
        # starts each step) and the indexes of the configured faults that no longer hold it: fired, or released
        # unfired (a mid_put kill whose replica has no claim: Supervisor._released). The Actor waits on the rest.
        self.actor_step = 0
        self.faults_settled: set[int] = set()

    def add_spans(self, spans: list[dict]) -> None:
        self.spans.extend(spans)

    def add_step(self, record: dict) -> None:
        self.steps[record["step"]] = record

    def set_actor_step(self, k: int) -> None:
        self.actor_step = k

    def fault_state(self, fired: list[int] | None = None, released: list[int] | None = None) -> tuple[int, set[int]]:
        """(the Actor's step, the faults settled); the driver's injector adds those `fired` and `released` first."""
        self.faults_settled.update(fired or (), released or ())
        return self.actor_step, set(self.faults_settled)

    def snapshot(self, since_span: int = 0) -> tuple[list[dict], dict[int, dict]]:
        return self.spans[since_span:], dict(self.steps)

    def all_spans(self) -> list[dict]:
        return list(self.spans)


def union_seconds(intervals) -> float:
    """Length of the union of (start, end) intervals: overlapping spans count once, empty ones not at all."""
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def busy_seconds(spans: list[dict], t0: float, t1: float, roles: list[str]) -> dict[str, float]:
    """Seconds each role spent inside spans, clipped to the window [t0, t1] (overlapping spans merged)."""
    return {role: round(union_seconds((max(s["start"], t0), min(s["end"], t1)) for s in spans if s["role"] == role), 4)
            for role in roles}


def cpu_seconds(spans: list[dict], t0: float, t1: float, roles: list[str]) -> dict[str, float]:
    """CPU seconds of each role's spans that end in [t0, t1) (a span's CPU cannot be split by time; a nested
    span carries none, its outermost one all)."""
    return {role: round(sum(s.get("cpu", 0.0) for s in spans if s["role"] == role and t0 <= s["end"] < t1), 4)
            for role in roles}


def chrome_trace(spans: list[dict], t0: float) -> dict:
    """Chrome trace format (chrome://tracing, Perfetto): one lane (tid) per role."""
    roles = sorted({s["role"] for s in spans})
    lane = {r: i for i, r in enumerate(roles)}
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": lane[r], "args": {"name": r}} for r in roles]
    for s in spans:
        events.append({"name": s["name"], "ph": "X", "pid": 1, "tid": lane[s["role"]],
                       "ts": round((s["start"] - t0) * 1e6), "dur": round((s["end"] - s["start"]) * 1e6),
                       "args": {"step": s["step"], **({"cpu_s": round(s["cpu"], 4)} if s.get("cpu") else {}),
                                **s["args"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
