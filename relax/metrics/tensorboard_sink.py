"""The tensorboard sink: event files in the run folder's tensorboard/ (`tensorboard --logdir RUN/tensorboard`).

Written with torch's SummaryWriter (the tensorboard package's event-file writer underneath). Every number of a
step is a scalar at that step (per-role values as `busy_share/rollout`); an event is a text entry under
`events/<kind>` plus a running count `events/<kind>_total`, both at the last step seen.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from relax.metrics.sinks import scalars
from relax.run_folder import RunFolder


class TensorBoardSink:
    def __init__(self, logdir: Path):
        from torch.utils.tensorboard import SummaryWriter

        # The writer creates the folder; a path that cannot be made raises here (the Reporter drops the sink).
        self.writer = SummaryWriter(log_dir=str(logdir))
        self.last_step = 0
        self.counts: Counter = Counter()

    def step(self, step: int, metrics: Mapping) -> None:
        for name, value in scalars(metrics):
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # live: TensorBoard shows the step now, and a write error surfaces at this step
        self.last_step = step

    def event(self, kind: str, payload: Mapping) -> None:
        self.counts[kind] += 1
        self.writer.add_text(f"events/{kind}", json.dumps(dict(payload), default=str), self.last_step)
        self.writer.add_scalar(f"events/{kind}_total", self.counts[kind], self.last_step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def make(cfg, folder: RunFolder) -> TensorBoardSink:
    return TensorBoardSink(folder.sink_dir("tensorboard"))
