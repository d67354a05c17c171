"""Held-out accuracy for omni and agent tasks (relax.evaluate dispatches here when `task.kind` is not text):
the eval split through the same rollout source as training (media fields / multi-turn episodes with tools),
graded by the task's rule on the model's own tokens."""

from __future__ import annotations

import torch

from relax.models import build_model
from relax.omni.source import engine_class, make_source
from relax.tasks import make_task


def accuracy(cfg, state: dict[str, torch.Tensor], temperature: float = 0.0, samples: int = 1, batch: int = 64) -> float:
    model, tok = build_model(cfg.model, cfg.seed)
    engine = engine_class(cfg)(model, tok, dtype=cfg.rollout.dtype, temperature=temperature,
                               top_p=cfg.rollout.top_p, seed=cfg.seed)
    engine.update_weights(state, 0)
    data = make_task(cfg.task, cfg.seed, "eval")
    source = make_source(cfg, tok, engine, data)
    idx = [i for i in range(min(cfg.task.eval_size, len(data))) for _ in range(samples)]
    total = 0.0
    for lo in range(0, len(idx), batch):
        chunk = idx[lo:lo + batch]
        out = source.rows(chunk, cfg.rollout.max_new_tokens)
        masks = out.get("loss_mask", [None] * len(chunk))
        for i, resp, mask in zip(chunk, out["response_ids"], masks):
            text = tok.decode(resp if mask is None else resp[mask.bool()])
            total += float(data.score(data[i], text))
    return total / max(len(idx), 1)
