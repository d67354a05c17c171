"""Benchmark (pytest-benchmark, not a timed assertion): what the metrics sinks cost per training step.

    pytest tests/metrics/bench_sinks.py --benchmark-only --benchmark-timer=time.process_time

One `Reporter.step` with a row shaped like a real one (the fields of an async run's metrics.jsonl row, five
roles), with only jsonl (the default), each other sink beside it, and every sink on. The sinks run in the
driver's poll, off the roles' critical path, so what they take from a step is the driver's CPU time they use
(process_time: the writers' threads included; W&B's own wandb-core process is not); divide it by a run's
mean_step_time_s (summary.json; ~0.76 s for results/reference/async/cpu) for the share. Aim: under 1%.
The wall-clock timer (the default) on a loaded machine measures waiting for a core as much as the work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from relax.config import load_config
from relax.metrics.sinks import build_reporter
from relax.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[2]
ROLES = ["rollout", "reward", "reference", "advantages", "actor"]


def _row(k: int) -> dict:
    busy = {r: 0.1 * (i + 1) for i, r in enumerate(ROLES)}
    return {"wall_time_s": 0.76 * (k + 1), "step_time_s": 0.76, "train_time_s": 0.4, "reward_mean": 0.5,
            "samples": 16, "tokens": 256, "staleness_mean": 0.5, "staleness_max": 1, "trainer_wait_s": 0.1,
            "weight_sync_s": 0.02, "weight_version": k + 1, "loss": -0.01, "grad_norm": 0.8, "lr": 1e-4,
            "clip_frac": 0.1, "approx_kl": 0.001, "busy_s": busy, "busy_share": {r: b / 0.76 for r, b in busy.items()}}


@pytest.mark.parametrize("sinks", [["jsonl"], ["jsonl", "tensorboard"], ["jsonl", "wandb"], ["jsonl", "mlflow"],
                                   ["jsonl", "tensorboard", "wandb", "mlflow"]], ids=lambda s: "+".join(s[1:]) or "jsonl")
def test_reporter_step_cost(benchmark, tmp_path, sinks):
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [f"metrics.sinks=[{','.join(sinks)}]"])
    reporter = build_reporter(cfg, RunFolder.create(tmp_path, cfg.name, cfg.profile, "bench"))
    steps = iter(range(10**9))
    try:
        benchmark.pedantic(lambda: reporter.step(next(steps), _row(0)), rounds=200, iterations=1, warmup_rounds=5)
        assert set(reporter.sinks) == set(sinks)  # none failed: every sink took every step
    finally:
        reporter.close()
