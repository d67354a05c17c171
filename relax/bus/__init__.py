"""The data bus: every role exchanges rows through TransferQueue partitions, never with each other.

Import from here (`from relax.bus import Bus`). The names resolve lazily: the staleness gate's actor
(`gate.Coordinator`) imports only Ray, not torch, tensordict and TransferQueue (seconds of CPU per process).
"""

import os

import psutil

from relax.lazy import lazy_getattr

# TQ clamps its torch thread count to the physical cores and logs a warning on every put and get when
# TQ_NUM_THREADS (default 8) exceeds them. TQ reads it at import, so set it first; set before ray.init,
# Ray's workers (TQ's storage units included) inherit it too.
os.environ.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))

# The longest a consumer (a streaming role, the StreamingLoader, an emulated schedule's trainer) blocks in one
# fetch waiting for its partition to change (Bus.fetch `wait`), before it looks at its own conditions again (a
# timeout, a partition trained without it). A new row wakes it at once: this bounds only those checks.
WAIT_S = 1.0

# The bus's own processes, as relax.metrics.processes labels them: TransferQueue's controller and storage unit, the
# coordinator (staleness gate, change counts). What a bus call costs beyond its caller's time runs here.
PROCESSES = ("ray::TransferQueueController", "ray::SimpleStorageUnit", "ray::Coordinator")

_HOME = {"Batch": "batch", "Bus": "bus", "StreamingLoader": "loader"}
__all__ = [*_HOME, "WAIT_S", "PROCESSES"]


__getattr__ = lazy_getattr(__name__, _HOME)
