"""Elastic rollout scaling: the scale-out and scale-in operations and their state machines.

scale out (absolute target `num_replicas`):
    PENDING -> CREATING -> HEALTH_CHECKING -> WEIGHT_SYNCING -> READY -> ACTIVE
    any stage -> FAILED (every replica it created is removed again) or CANCELLED (on request, same rollback)
scale in (absolute target, newest replicas first):
    PENDING -> DRAINING (no new work; in-flight work finishes, unless `force`) -> REMOVING -> COMPLETED | FAILED

One operation runs at a time: any mutating request while one is PENDING or past it and not yet terminal is
refused (`Conflict`, HTTP 409), checked before anything else, so a duplicate scale_out is 409, not NOOP.
A target already met answers NOOP (not stored: nothing to poll); a target above `max_replicas` or above what
the cluster can place (`pool.capacity()`) is `BadRequest` (HTTP 400), as is removing replicas present at start;
`dry_run` only says what would go (stored as DRY_RUN, so its id can be queried). Finished operations are kept
up to `keep_finished` (the oldest are forgotten), so recovery.json stays small.
Each operation runs in its own thread against a `RolloutPool`, so the API returns at once; cancel is checked
between every replica created and health-checked, so it stops a creation in progress.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

from relax.api.pool import RolloutPool

SCALE_OUT_STATES = ["PENDING", "CREATING", "HEALTH_CHECKING", "WEIGHT_SYNCING", "READY", "ACTIVE", "FAILED",
                    "CANCELLED", "NOOP"]
SCALE_IN_STATES = ["PENDING", "DRAINING", "REMOVING", "COMPLETED", "FAILED", "NOOP", "DRY_RUN"]
TERMINAL = {"ACTIVE", "FAILED", "CANCELLED", "NOOP", "COMPLETED", "DRY_RUN"}


class Conflict(Exception):
    """Another operation is running (HTTP 409)."""


class BadRequest(Exception):
    """The request cannot be honoured as asked (HTTP 400)."""


class NotFound(KeyError):
    """No operation with that id (HTTP 404)."""


@dataclass
class Operation:
    kind: str  # scale_out | scale_in
    num_replicas: int
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    status: str = "PENDING"
    engine_ids: list[str] = field(default_factory=list)
    failed_engines: list[str] = field(default_factory=list)
    error_message: str | None = None
    weight_version: int | None = None
    force: bool = False
    dry_run: bool = False
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    history: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self):
        self.history.append((self.status, self.created_at))

    def to(self, status: str) -> None:
        self.status = status
        self.updated_at = time.time()
        self.history.append((status, self.updated_at))

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def view(self) -> dict:
        d = asdict(self)
        d["history"] = [{"status": s, "at": t} for s, t in self.history]
        return d


class ScaleManager:
    def __init__(self, pool: RolloutPool, timeout_s: float = 300.0, drain_timeout_s: float = 60.0,
                 max_replicas: int | None = None, keep_finished: int = 100):
        self.pool = pool
        self.max_replicas = max_replicas  # rollout.max_replicas
        self.keep_finished = keep_finished
        self.timeout_s = timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.ops: dict[str, Operation] = {}
        self.lock = threading.Lock()
        self.cancelled: set[str] = set()
        self.threads: list[threading.Thread] = []

    # -- requests
    def _refuse_if_running(self) -> None:
        running = next((op for op in self.ops.values() if not op.done), None)
        if running is not None:
            raise Conflict(f"{running.kind} {running.request_id} is still {running.status}; retry when it is done")

    def _store(self, op: Operation) -> None:
        """Under self.lock. Keeps every unfinished operation and the newest `keep_finished` finished ones."""
        self.ops[op.request_id] = op
        finished = [rid for rid, o in self.ops.items() if o.done]
        for rid in finished[: max(0, len(finished) - self.keep_finished)]:
            del self.ops[rid]

    def _check_limit(self, num_replicas: int) -> None:
        if self.max_replicas is not None and num_replicas > self.max_replicas:
            raise BadRequest(f"num_replicas={num_replicas} exceeds rollout.max_replicas={self.max_replicas}")
        capacity = getattr(self.pool, "capacity", None)
        cap = capacity() if capacity is not None else None
        if cap is not None and num_replicas > cap:
            raise BadRequest(f"num_replicas={num_replicas} exceeds what the cluster can place: {cap} rollout "
                             f"replicas (free resources for resources.rollout)")

    def _admit(self, op: Operation, work) -> Operation:
        self._store(op)
        t = threading.Thread(target=self._guard, args=(op, work), name=f"relax-{op.kind}", daemon=True)
        self.threads.append(t)
        t.start()
        return op

    def scale_out(self, num_replicas: int, timeout_s: float | None = None) -> Operation:
        if num_replicas < 1:
            raise BadRequest("num_replicas must be >= 1")
        with self.lock:
            self._refuse_if_running()
            current = self.pool.count()
            op = Operation("scale_out", num_replicas)
            if num_replicas <= current:  # met already: idempotent (not stored)
                op.to("NOOP")
                op.error_message = f"{current} replicas already serve (target {num_replicas})"
                return op
            self._check_limit(num_replicas)
            return self._admit(op, lambda: self._scale_out(op, num_replicas - current, timeout_s or self.timeout_s))

    def scale_in(self, num_replicas: int, force: bool = False, dry_run: bool = False) -> Operation:
        if num_replicas < 1:
            raise BadRequest("num_replicas must be >= 1")
        with self.lock:
            self._refuse_if_running()
            engines = [e for e in self.pool.engines() if e["status"] not in ("REMOVED", "REMOVING", "DRAINING")]
            initial = [e for e in engines if e["initial"]]
            if num_replicas < len(initial):
                raise BadRequest(f"num_replicas={num_replicas} would remove replicas present at start "
                                 f"({len(initial)} initial replicas cannot be removed)")
            added = sorted((e for e in engines if not e["initial"]), key=lambda e: int(e["engine_id"].rsplit("-", 1)[1]))
            victims = [e["engine_id"] for e in reversed(added)][: max(0, len(engines) - num_replicas)]
            op = Operation("scale_in", num_replicas, force=force, dry_run=dry_run, engine_ids=victims)
            if not victims:
                op.to("NOOP")
                return op
            if dry_run:  # a preview: stored so its id answers, nothing runs
                op.to("DRY_RUN")
                self._store(op)
                return op
            return self._admit(op, lambda: self._scale_in(op, victims, force))

    def get(self, request_id: str, kind: str | None = None) -> Operation:
        with self.lock:
            op = self.ops.get(request_id)
        if op is None or (kind is not None and op.kind != kind):
            raise NotFound(request_id)
        return op

    def cancel(self, request_id: str) -> Operation:
        op = self.get(request_id, "scale_out")
        with self.lock:
            if op.done or op.status == "READY":
                raise Conflict(f"scale_out {request_id} is already {op.status}")
            self.cancelled.add(request_id)
        return op

    # -- workers
    def _guard(self, op: Operation, work) -> None:
        try:
            work()
        except Exception as err:  # any stage: record it, the operation fails (after its rollback)
            op.error_message = f"{type(err).__name__}: {err}"
            op.to("FAILED")

    def _check_cancel(self, op: Operation) -> None:
        if op.request_id in self.cancelled:
            raise _Cancelled()

    def _scale_out(self, op: Operation, n: int, timeout_s: float) -> None:
        made: list[str] = []
        try:
            self._check_cancel(op)
            op.to("CREATING")
            for _ in range(n):
                self._check_cancel(op)
                made.append(self.pool.create_replica())
                op.engine_ids = list(made)
            self._check_cancel(op)
            op.to("HEALTH_CHECKING")
            for rid in made:
                self._check_cancel(op)
                self.pool.health_check(rid, timeout_s)
            self._check_cancel(op)
            op.to("WEIGHT_SYNCING")
            op.weight_version = min(self.pool.sync_weights(rid) for rid in made)
            self._check_cancel(op)
            op.to("READY")
            for rid in made:
                self.pool.activate(rid)
            op.to("ACTIVE")
        except _Cancelled:
            self._rollback(made, op)
            op.to("CANCELLED")
        except Exception:
            self._rollback(made, op)
            raise

    def _rollback(self, made: list[str], op: Operation) -> None:
        for rid in made:
            try:
                self.pool.remove(rid)
            except Exception:
                op.failed_engines.append(rid)

    def _scale_in(self, op: Operation, victims: list[str], force: bool) -> None:
        op.to("DRAINING")
        for rid in victims:
            if not force and not self.pool.drain(rid, self.drain_timeout_s):
                op.error_message = f"{rid} did not drain within {self.drain_timeout_s} s; removed anyway"
        op.to("REMOVING")
        for rid in victims:
            try:
                self.pool.remove(rid)
            except Exception as err:
                op.failed_engines.append(rid)
                op.error_message = f"{rid}: {err}"
        op.to("COMPLETED")

    def wait(self, timeout: float = 30.0) -> None:
        for t in list(self.threads):
            t.join(timeout)

    def views(self) -> list[dict]:
        with self.lock:
            ops = list(self.ops.values())
        return [op.view() for op in ops]

    def counters(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        with self.lock:
            ops = list(self.ops.values())
        for op in ops:
            out[(op.kind, op.status)] = out.get((op.kind, op.status), 0) + 1
        return out


class _Cancelled(Exception):
    pass
