"""Greedy accuracy of a set of weights on the task's held-out split (before / after RL)."""

from __future__ import annotations

import torch

from relax.config import ExperimentConfig
from relax.engines import TorchEngine
from relax.models import build_model
from relax.tasks import make_task


def greedy_accuracy(cfg: ExperimentConfig, state: dict[str, torch.Tensor], n: int | None = None,
                    batch: int = 32) -> float:
    model, tok = build_model(cfg.model, cfg.seed)
    engine = TorchEngine(model, tok, dtype=cfg.rollout.dtype, temperature=0.0)
    engine.update_weights(state, 0)
    data = make_task(cfg.task, cfg.seed, "eval")
    n = min(n or cfg.task.eval_size, len(data))
    correct = 0.0
    for lo in range(0, n, batch):
        items = [data[i] for i in range(lo, min(n, lo + batch))]
        gens = engine.generate([tok.encode(p.prompt) for p in items], cfg.rollout.max_new_tokens)
        correct += sum(float(data.score(p, tok.decode(g.token_ids))) for p, g in zip(items, gens))
    return correct / max(n, 1)
