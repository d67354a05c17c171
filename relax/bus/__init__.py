"""The data bus: every role exchanges rows through TransferQueue partitions, never with each other."""

import os

import psutil

# TQ clamps its torch thread count to the physical cores and logs a warning on every put and get when
# TQ_NUM_THREADS (default 8) exceeds them. TQ reads it at import, so set it first; set before ray.init,
# Ray's workers (TQ's storage units included) inherit it too.
os.environ.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))

from relax.bus.batch import Batch  # noqa: E402
from relax.bus.bus import Bus  # noqa: E402
from relax.bus.loader import StreamingLoader  # noqa: E402

__all__ = ["Batch", "Bus", "StreamingLoader"]
