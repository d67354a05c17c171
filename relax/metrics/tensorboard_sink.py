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

FLUSH_S = 5  # seconds between the writer's flushes to the event file


class TensorBoardSink:
    def __init__(self, logdir: Path):
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        # The writer creates the folder; a path that cannot be made raises here (the Reporter drops the sink).
        # flush_secs: TensorBoard sees a step within seconds; a flush per step costs a write() per step
        self.writer = SummaryWriter(log_dir=str(logdir), flush_secs=FLUSH_S)
        self.summary = Summary  # the proto (imported here: only a run that asks for TensorBoard loads it)
        self.last_step = 0
        self.counts: Counter = Counter()

    def step(self, step: int, metrics: Mapping) -> None:
        # One event holding every scalar of the step (add_scalar per name costs ~90 us each: a proto and an
        # event apiece). The writer's thread writes it; an error it met is raised by the next call here.
        values = [self.summary.Value(tag=name, simple_value=value) for name, value in scalars(metrics)]
        self.writer.file_writer.add_summary(self.summary(value=values), step)
        self.last_step = step

    def event(self, kind: str, payload: Mapping) -> None:
        self.counts[kind] += 1
        self.writer.add_text(f"events/{kind}", json.dumps(dict(payload), default=str), self.last_step)
        self.writer.add_scalar(f"events/{kind}_total", self.counts[kind], self.last_step)
        self.writer.flush()  # events are rare: shown at once

    def close(self) -> None:
        self.writer.close()


def make(cfg, folder: RunFolder) -> TensorBoardSink:
    return TensorBoardSink(folder.sink_dir("tensorboard"))
