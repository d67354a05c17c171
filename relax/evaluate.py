"""Accuracy of a set of weights on the task's held-out split (before / after RL).

Greedy decoding measures the policy's mode; sampling at the rollout temperature measures the quantity RL
optimises (the expected reward), free of the prompt-to-prompt noise of per-step training rewards.
"""

from __future__ import annotations

import torch

from relax.config import ExperimentConfig
from relax.engines import TorchEngine
from relax.models import build_model
from relax.tasks import make_task


def accuracy(cfg: ExperimentConfig, state: dict[str, torch.Tensor], temperature: float = 0.0,
             samples: int = 1, batch: int = 64) -> float:
    """Mean reward over the eval split, `samples` responses per prompt (greedy when temperature is 0)."""
    model, tok = build_model(cfg.model, cfg.seed)
    engine = TorchEngine(model, tok, dtype=cfg.rollout.dtype, temperature=temperature, top_p=cfg.rollout.top_p,
                         seed=cfg.seed)
    engine.update_weights(state, 0)
    data = make_task(cfg.task, cfg.seed, "eval")
    items = [data[i] for i in range(min(cfg.task.eval_size, len(data))) for _ in range(samples)]
    total = 0.0
    for lo in range(0, len(items), batch):
        chunk = items[lo : lo + batch]
        gens = engine.generate([tok.encode(p.prompt) for p in chunk], cfg.rollout.max_new_tokens)
        total += sum(float(data.score(p, tok.decode(g.token_ids))) for p, g in zip(chunk, gens))
    return total / max(len(items), 1)


def greedy_accuracy(cfg: ExperimentConfig, state: dict[str, torch.Tensor]) -> float:
    return accuracy(cfg, state, temperature=0.0)


def sampled_reward(cfg: ExperimentConfig, state: dict[str, torch.Tensor], samples: int = 4) -> float:
    return accuracy(cfg, state, temperature=cfg.rollout.temperature, samples=samples)
