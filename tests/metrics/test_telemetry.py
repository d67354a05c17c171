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


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_span_carries_its_process_cpu_seconds_and_a_nested_one_none():
    rec = SpanRecorder("actor", None, flush_every=100)
    with rec.span("compute", step=0):
        _spin(0.05)
    with rec.span("wait", step=0):
        time.sleep(0.1)  # wall time, next to no CPU
    with rec.span("outer", step=1):
        with rec.span("inner", step=1):
            _spin(0.05)
    cpu = {s["name"]: s["cpu"] for s in rec.pending}
    assert cpu["compute"] >= 0.05 and cpu["wait"] < 0.05
    assert cpu["inner"] == 0.0 and cpu["outer"] >= 0.05  # the outermost span carries it once


def test_cpu_seconds_counts_each_span_in_the_window_it_ends_in():
    from relax.metrics.telemetry import cpu_seconds

    spans = [{"role": "actor", "start": 0.0, "end": 1.5, "cpu": 0.4},
             {"role": "actor", "start": 1.5, "end": 2.5, "cpu": 0.3},
             {"role": "rollout", "start": 0.5, "end": 0.9, "cpu": 0.2}]
    assert cpu_seconds(spans, 0.0, 2.0, ["actor", "rollout", "reward"]) == {"actor": 0.4, "rollout": 0.2, "reward": 0.0}
    assert cpu_seconds(spans, 2.0, 3.0, ["actor"]) == {"actor": 0.3}


def test_chrome_trace_shows_a_spans_cpu_seconds():
    from relax.metrics.telemetry import chrome_trace

    spans = [{"role": "actor", "name": "train", "start": 1.0, "end": 1.5, "step": 0, "cpu": 0.25, "args": {}},
             {"role": "actor", "name": "inner", "start": 1.1, "end": 1.2, "step": 0, "cpu": 0.0, "args": {}}]
    x = [e for e in chrome_trace(spans, 1.0)["traceEvents"] if e["ph"] == "X"]
    assert x[0]["args"] == {"step": 0, "cpu_s": 0.25} and x[1]["args"] == {"step": 0}
