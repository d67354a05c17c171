"""Bus: the only data path between roles, a thin layer over TransferQueue (TQ).

Partition `train_{k}` holds the rows (samples) of RL step k; fields (columns) are added by each role as it
runs. A row is handed to each task name at most once (TQ's per-task consumption). The driver calls
`Bus.start`; a role receives the Bus object (it pickles) or calls `Bus.connect()`; either way the TQ
client is opened lazily in the process that first uses it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import ray
import torch
import transfer_queue as tq
from transfer_queue import BatchMeta

from relax.bus.batch import Batch, Value, rows_length, to_tensordict, from_tensordict
from relax.bus.gate import NAME, NAMESPACE, Coordinator
from relax.bus.sampler import PUT_KEY, ROW_KEY, GroupSampler
from relax.config import BusConfig

log = logging.getLogger(__name__)
_ATTACH_LOCK = threading.Lock()  # one TQ attach per process at a time (see Bus._tq)

TQ_CONTROLLER = ("TransferQueueController", "transfer_queue")  # (name, namespace) TQ registers


def partition_id(step: int) -> str:
    return f"train_{step}"


def _get(ref):
    """ray.get, raising the coordinator's own error (its message is the point) instead of Ray's wrapper."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        raise err.cause from None


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _int_ids(rows: dict[str, Value], name: str, n: int) -> torch.Tensor:
    if name not in rows:
        raise ValueError(f"put_rows: rows must include the int field '{name}'")
    ids = rows[name]
    if not isinstance(ids, torch.Tensor):
        try:
            ids = torch.tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            ids = None
    if ids is None or ids.shape != (n,) or ids.dtype not in _INT_DTYPES:
        raise ValueError(f"put_rows: field '{name}' must be one int per row (a 1-D int tensor or a list of int)")
    return ids


@dataclass
class _Put:
    """One caller's put_rows, waiting to be sent with the other puts of this process (`Bus._lead`)."""

    step: int
    rows: dict[str, Value]
    td: object  # its TensorDict
    kinds: tuple  # what must match for two puts to travel as one (fields, tensor or list, dtype, trailing shape)
    n: int
    timeout: float | None
    wake: threading.Event = field(default_factory=threading.Event)
    promoted: bool = False  # woken to take over sending
    indexes: list[int] | None = None
    error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return self.indexes is not None or self.error is not None


def _kinds(rows: dict[str, Value]) -> tuple:
    def kind(v):
        t = v if isinstance(v, torch.Tensor) else v[0]
        return (isinstance(v, torch.Tensor), type(t).__name__, getattr(t, "dtype", None),
                tuple(t.shape[1:]) if isinstance(t, torch.Tensor) else None)

    return tuple(sorted((k, kind(v)) for k, v in rows.items()))


def _merge(puts: list[_Put]) -> dict[str, Value]:
    """The rows of `puts`, one after the other (their fields match: `_Put.kinds`)."""
    out = {}
    for k, v in puts[0].rows.items():
        parts = [p.rows[k] for p in puts]
        out[k] = torch.cat(parts) if isinstance(v, torch.Tensor) else [x for part in parts for x in part]
    return out


class Bus:
    def __init__(self, coordinator, group_size: int, capacity_rows: int):
        self._coord = coordinator
        self.group_size = group_size
        self.capacity_rows = capacity_rows
        self._client = None
        self._starting: threading.Thread | None = None  # Bus.start(wait=False)'s TQ start, until wait_started
        self._start_error: BaseException | None = None
        # Group commit: puts made while this process is sending go out together as one reservation, one TQ
        # metadata request and one TQ put (each a round trip), each keeping its own sequence number.
        self._puts: list[_Put] = []
        self._puts_lock = threading.Lock()
        self._sending = False
        # This process's bus operations by kind, for summary.json's bus_calls_per_step (the simulator counts its
        # own): put (rows in), write (fields added), fetch (a lookup that found rows), empty_fetch (one that found
        # none: woken for rows another consumer took, or for fields not all there yet), wait (a block in the
        # coordinator until the partition changes).
        self.calls: Counter[str] = Counter()
        self._calls_lock = threading.Lock()
        # The change count each consumer (thread, task, fields) last read from the coordinator, with its partition:
        # an idle consumer blocks on it at once instead of reading the count afresh and fetching once more (fetch).
        self._seen: dict[tuple[int, str, tuple[str, ...]], tuple[int, int]] = {}

    def __reduce__(self):
        # The TQ client (sockets, a loop thread) stays behind; the receiving process opens its own.
        return (Bus, (self._coord, self.group_size, self.capacity_rows))

    # ---- lifecycle -------------------------------------------------------------------------------------
    @classmethod
    def start(cls, cfg: BusConfig, group_size: int, max_staleness: int, wait: bool = True) -> Bus:
        """Start TQ (controller with our sampler, storage) and the coordinator. Driver only, after ray.init.

        wait=False returns at once and TQ starts on a thread: its two processes start one after the other, each
        importing for seconds on one core, while the caller starts other processes on the rest. Call
        `wait_started` before any process uses TQ (this one's first TQ call waits by itself)."""
        if not ray.is_initialized():
            raise RuntimeError("Bus.start: call ray.init() first")
        if group_size < 1 or max_staleness < 0:
            raise ValueError(f"Bus.start: need group_size >= 1, max_staleness >= 0 (got {group_size}, {max_staleness})")
        for name, namespace in ((NAME, NAMESPACE), TQ_CONTROLLER):
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                continue
            raise RuntimeError(f"Bus.start: {namespace}/{name} is already running; close the previous bus first")
        # The coordinator's process starts while tq.init starts TQ's controller and then its storage.
        coord = Coordinator.options(name=NAME, namespace=NAMESPACE).remote(cfg.capacity_rows, group_size, max_staleness)
        bus = cls(coord, group_size, cfg.capacity_rows)
        bus._starting = threading.Thread(target=bus._start_tq, args=(cfg, max_staleness), name="bus-start",
                                         daemon=True)
        bus._starting.start()
        if wait:
            bus.wait_started()
        return bus

    def _start_tq(self, cfg: BusConfig, max_staleness: int) -> None:
        t0 = time.time()
        try:
            tq.init(
                {
                    # Polling mode: a fetch with nothing ready returns at once instead of blocking the controller.
                    "controller": {"sampler": GroupSampler(), "polling_mode": True},
                    "backend": {"SimpleStorage": {"num_data_storage_units": cfg.storage_units}},
                }
            )
            _get(self._coord.settings.remote())
            self._client = tq.get_client()
        except BaseException as err:  # noqa: BLE001 -- wait_started raises it in the caller's thread
            self._start_error = err
            return
        log.info("bus started in %.1f s (capacity %d rows, group size %d, max staleness %d)",
                 time.time() - t0, cfg.capacity_rows, self.group_size, max_staleness)

    def wait_started(self) -> None:
        """Block until `start(wait=False)`'s TQ processes are up; raise what stopped them (once: later calls pass)."""
        starting = self._starting
        if starting is not None:
            starting.join()
            self._starting = None
        err, self._start_error = self._start_error, None
        if err is not None:
            raise RuntimeError(f"Bus.start: TransferQueue did not start: {err}") from err

    @classmethod
    def connect(cls) -> Bus:
        """Attach to the bus the driver started (inside any Ray process)."""
        try:
            coord = ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            raise RuntimeError("Bus.connect: no bus is running (the driver must call Bus.start first)") from None
        s = _get(coord.settings.remote())
        return cls(coord, s["group_size"], s["capacity_rows"])

    def close(self) -> None:
        """Shut down TQ and the coordinator (driver, at the end of the run; also after a failed start)."""
        starting = self._starting
        if starting is not None:
            starting.join()  # a start still under way would leave TQ's processes behind
            self._starting = None
        tq.close()
        self._client = None
        ray.kill(self._coord)

    def reset(self, max_staleness: int | None = None) -> None:
        """Start a new run on the same bus: drop every partition, reset the gate (and optionally its bound).
        Only while no role is using the bus; saves restarting TQ between runs of one driver."""
        client = self._tq()
        for pid in client.get_partition_list():
            client.clear_partition(pid)
        _get(self._coord.reset.remote(max_staleness))

    def _tq(self):
        # Threaded actors (max_concurrency > 1) call this from several threads at once: TQ's client is
        # usable only after init() also set up its storage manager, so one thread attaches, the rest wait.
        if self._starting is not None:
            self.wait_started()
        with _ATTACH_LOCK:
            if self._client is None:
                tq.init()  # no conf: attaches to the running controller
                self._client = tq.get_client()
        return self._client

    # ---- data ------------------------------------------------------------------------------------------
    def put_rows(self, step: int, rows: dict[str, Value], timeout: float | None = 600.0) -> list[int]:
        """Insert whole groups into partition `step`; returns their global indexes. Blocks while the bus
        holds capacity_rows rows (TimeoutError after `timeout` s)."""
        n = rows_length(rows)
        G = self.group_size
        if n % G:
            raise ValueError(f"put_rows: {n} rows is not a whole number of groups of group_size={G}")
        sample_ids = _int_ids(rows, "sample_id", n)
        groups = _int_ids(rows, "group_id", n).view(-1, G)
        if (groups != groups[:, :1]).any():
            raise ValueError(f"put_rows: 'group_id' must be constant over each consecutive block of {G} rows")
        if len(set(groups[:, 0].tolist())) != n // G:
            raise ValueError("put_rows: two groups share a 'group_id'")
        if len(set(sample_ids.tolist())) != n:
            raise ValueError("put_rows: 'sample_id' values must be unique")
        td = to_tensordict(rows)  # a bad value fails here, in its caller, before anything is sent
        if n > self.capacity_rows:
            raise ValueError(f"put_rows: {n} rows can never fit in bus.capacity_rows={self.capacity_rows}")
        put = _Put(step, rows, td, _kinds(rows), n, timeout)
        self._count("put")  # one a call, however many of this process's puts go out together
        with self._puts_lock:
            self._puts.append(put)
            lead, self._sending = not self._sending, True
        if lead:
            self._lead(put)
        while not put.finished:
            put.wake.wait()
            put.wake.clear()
            if put.promoted:
                put.promoted = False
                self._lead(put)
        if put.error is not None:
            raise put.error
        return put.indexes

    def _lead(self, own: _Put) -> None:
        """Send the waiting puts, batch by batch, until none waits or `own` is sent; in the latter case the
        oldest waiting put's thread takes over (so no caller sends for the others forever)."""
        while True:
            with self._puts_lock:
                if not self._puts:
                    self._sending = False
                    return
                if own.finished:
                    nxt = self._puts[0]
                    nxt.promoted = True
                    nxt.wake.set()
                    return
                first = self._puts[0]
                batch, rows, rest = [], 0, []
                for p in self._puts:
                    if p.step == first.step and p.kinds == first.kinds and rows + p.n <= self.capacity_rows:
                        batch.append(p)
                        rows += p.n
                    else:
                        rest.append(p)
                self._puts = rest
            try:
                indexes = self._send(first.step, batch, rows)
            except BaseException as err:  # every put of the batch fails with it; none of it was kept
                for p in batch:
                    p.error = err
                    p.wake.set()
                continue
            at = 0
            for p in batch:
                p.indexes = indexes[at:at + p.n]
                at += p.n
                p.wake.set()

    def _send(self, step: int, batch: list[_Put], n: int) -> list[int]:
        td = batch[0].td if len(batch) == 1 else to_tensordict(_merge(batch))
        timeouts = [p.timeout for p in batch if p.timeout is not None]
        timeout = min(timeouts) if timeouts else None  # the most impatient caller's
        seq = _get(self._coord.reserve.remote(step, n, timeout, len(batch)))
        client = self._tq()
        try:
            meta = client.get_meta(
                data_fields=list(td.keys()), batch_size=n, partition_id=partition_id(step), mode="insert"
            )
            # The sampler's group and order key, stored by TQ alongside the data: each put its own sequence
            # number and row positions, as if sent alone.
            meta.update_custom_meta([{PUT_KEY: seq + j, ROW_KEY: i} for j, p in enumerate(batch) for i in range(p.n)])
            client.put(data=td, metadata=meta)
        except BaseException:
            _get(self._coord.release.remote(step, n))
            raise
        self.touch(step, list(td.keys()))
        return list(meta.global_indexes)

    def fetch(self, step: int, task: str, fields: list[str], max_rows: int, whole_groups: bool = False,
              wait: float = 0.0) -> Batch | None:
        """Up to `max_rows` rows of partition `step` whose `fields` are all produced and that `task` has not
        consumed, in insertion order; they count as consumed by `task`. None if nothing is ready, after waiting up
        to `wait` s: the wait blocks in the coordinator until the partition changes (`touch`) and fetches again,
        so an idle consumer costs no CPU and sees new rows one notice after they land."""
        if not fields:
            raise ValueError("fetch: name at least one field")
        if max_rows < (self.group_size if whole_groups else 1):
            raise ValueError(f"fetch: max_rows={max_rows} cannot hold a row{' group' if whole_groups else ''}")
        # A count read before a fetch that found nothing is safe to wait on: a change after the read makes the wait
        # return at once. The count this thread read last for this consumer and partition came before this fetch, so
        # the first idle wait blocks on it (none yet: read it now, then fetch once more); a stale one costs one more
        # fetch, never a missed change. (Another thread's count could postdate this fetch: never shared.)
        deadline, key = time.monotonic() + wait, (threading.get_ident(), task, tuple(fields))
        seen = self._seen[key][1] if self._seen.get(key, (None,))[0] == step else None
        while True:
            batch = self._fetch_once(step, task, fields, max_rows, whole_groups)
            left = deadline - time.monotonic()
            if batch is not None or left <= 0:
                return batch
            self._count("wait")
            seen = _get(self._coord.wait_changed.remote(step, seen, left, list(fields)))
            self._seen[key] = (step, seen)

    def _count(self, kind: str) -> None:
        with self._calls_lock:  # threaded actors call the bus from several threads
            self.calls[kind] += 1

    def touch(self, step: int, fields: list[str] | None = None) -> None:
        """Rows of partition `step` landed with `fields`, or (None) became fetchable again (a redelivery): wake the
        consumers waiting on it for one of those fields. Sent without waiting; it follows this process's TQ call,
        so a woken consumer finds the rows."""
        self._coord.touch.remote(step, fields)

    def _fetch_once(self, step: int, task: str, fields: list[str], max_rows: int, whole_groups: bool) -> Batch | None:
        client = self._tq()
        meta = client.get_meta(
            data_fields=list(fields), batch_size=1, partition_id=partition_id(step), task_name=task,
            sampling_config={"max_rows": max_rows, "group_size": self.group_size, "whole_groups": whole_groups},
        )
        if meta.size == 0:
            self._count("empty_fetch")
            return None
        self._count("fetch")
        data = from_tensordict(client.get_data(meta))
        return Batch(step, list(meta.global_indexes), data, meta.get_all_custom_meta())

    def write(self, batch: Batch, fields: dict[str, Value]) -> None:
        """Add `fields` (one entry per row of `batch`, in its order) to the batch's rows."""
        n = rows_length(fields)
        if n != batch.size:
            raise ValueError(f"write: {n} values per field for a batch of {batch.size} rows")
        if len(batch.row_meta) != n:
            raise ValueError("write: the batch must come from Bus.fetch (or its select/concat)")
        meta = BatchMeta(batch.indexes, [partition_id(batch.step)] * n, custom_meta=batch.row_meta)
        client = self._tq()
        client.put(data=to_tensordict(fields), metadata=meta)
        self._count("write")
        self.touch(batch.step, list(fields))

    def clear(self, step: int) -> None:
        """Drop partition `step` (once trained) and free its capacity."""
        client, pid = self._tq(), partition_id(step)
        try:
            client.clear_partition(pid)
        except RuntimeError as err:
            if "out of bounds" not in str(err):
                raise
            # A producer killed between TQ's index allocation and its write left rows TQ never sized its status
            # for, and TQ's clear indexes them too. A marker field written on every unwritten row sizes them.
            self._mark_unwritten(client, pid)
            client.clear_partition(pid)
        _get(self._coord.release.remote(step))

    def _mark_unwritten(self, client, pid: str) -> None:
        index, _ = client.get_consumption_status(task_name=f"clear-{uuid.uuid4().hex}", partition_id=pid)
        written = client.get_meta(data_fields=["sample_id"], batch_size=1, partition_id=pid,
                                  task_name=f"clear-{uuid.uuid4().hex}",
                                  sampling_config={"max_rows": 10**9, "group_size": self.group_size,
                                                   "whole_groups": False})
        unwritten = sorted(set(torch.as_tensor(index).tolist()) - set(written.global_indexes))
        if unwritten:
            log.warning("bus: partition %s has %d rows a dead producer never wrote; marking them to clear it",
                        pid, len(unwritten))
            client.put(data=to_tensordict({"relax_unwritten": torch.zeros(len(unwritten))}),
                       metadata=BatchMeta(unwritten, [pid] * len(unwritten)))

    # ---- staleness gate --------------------------------------------------------------------------------
    def wait_can_start(self, step: int, timeout: float | None = None) -> None:
        """Block until rollout may start partition `step`: step - oldest_unconsumed <= max_staleness."""
        _get(self._coord.wait_can_start.remote(step, timeout))

    def mark_trained(self, step: int) -> None:
        """The trainer finished partition `step` (weights published): advances oldest_unconsumed."""
        _get(self._coord.mark_trained.remote(step))

    def oldest_unconsumed(self) -> int:
        return _get(self._coord.oldest_unconsumed.remote())

    def held_rows(self) -> dict[int, int]:
        """Rows currently held per partition (capacity accounting)."""
        return _get(self._coord.held_rows.remote())
