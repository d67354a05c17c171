"""SpanRecorder.flush is acknowledged: once it returns, Telemetry holds the spans. Ray orders calls per caller
only, so a fire-and-forget flush from a role could still be in flight when the controller (another caller) reads
the spans at the end of a run -- the cause of a run whose last step record was missing (CI, test_on_policy_
distillation: metrics.jsonl had step 0 of 2)."""

import time
from pathlib import Path

import ray

from relax.metrics.telemetry import SpanRecorder


@ray.remote(num_cpus=0)
class SlowTelemetry:
    """Takes its time over each batch of spans, then leaves a mark outside Ray (a file), where the test looks."""

    def __init__(self, mark: str):
        self.mark = Path(mark)

    def add_spans(self, spans: list[dict]) -> None:
        time.sleep(0.3)
        self.mark.write_text(str(len(spans)))


def test_flush_returns_once_telemetry_holds_the_spans(local_ray, tmp_path):
    mark = tmp_path / "held"
    rec = SpanRecorder("actor", SlowTelemetry.remote(str(mark)), flush_every=100)
    for k in range(3):
        with rec.span("train", step=k):
            pass
    assert not mark.exists()  # below flush_every: nothing shipped yet
    rec.flush()
    assert mark.read_text() == "3" and rec.pending == []
