"""Benchmark (pytest-benchmark, not a timed assertion): simulate 200 steps of a 1024-GPU configuration.

    pytest tests/sim/bench_sim.py --benchmark-only

Qwen3-4B fully async on 1024 H800s: the paper's 16-GPU split (actor 8, rollout 4, reference 2, actor_fwd 2) x 64,
prompts per step x 64 (2048 prompts x 8 samples), one TP-1 SGLang engine per rollout GPU. Aim: < 60 s. Latest:
results/reference/sim/bench_1024.json (44.8 s, 2026-12-04, quiet).
"""

from __future__ import annotations

from pathlib import Path

from relax.config import load_config
from relax.sim import build
import relax.sim.sim  # noqa: F401  (torch, Ray and SimPy imported outside the timed run)

ROOT = Path(__file__).resolve().parents[2]


def config_1024(steps: int = 200):
    x = 64
    return load_config(ROOT / "experiments/async/h800x16.yaml", [
        f"steps={steps}", f"rollout.prompts_per_step={32 * x}", f"rollout.replicas={4 * x}",
        f"resources.actor.gpus={8 * x}", f"resources.rollout.gpus={4 * x}", f"resources.reference.gpus={2 * x}",
        f"resources.actor_fwd.gpus={2 * x}", f"bus.capacity_rows={32 * x * 8 * 4}", f"task.size={32 * x * 200}"])


def test_simulate_1024_gpus_200_steps(benchmark):
    cfg = config_1024()

    def run():
        return build(cfg, "h800").run()

    sim = benchmark.pedantic(run, rounds=1, iterations=1)
    assert len(sim.step_end) == 200
    assert sum(cfg.resources.model_dump()[r]["gpus"] for r in ("actor", "rollout", "reference", "actor_fwd")) == 1024
