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

# How long a consumer (a streaming role, the StreamingLoader, an emulated schedule's trainer) sleeps after an empty
# fetch before it asks again. The simulator prices the idle fetches with it (relax/sim/sim.py, Simulation.idle).
POLL_S = 0.005

_HOME = {"Batch": "batch", "Bus": "bus", "StreamingLoader": "loader"}
__all__ = [*_HOME, "POLL_S"]


__getattr__ = lazy_getattr(__name__, _HOME)
