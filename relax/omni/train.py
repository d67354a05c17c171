"""Supervised warm-up batches of omni tasks (relax.models.warmup trains on them when `task.kind` is omni).

prompt = media placeholders + question text, target = the answer + EOS; the media fields go to the forward
(the encoders and projectors learn here). The loop itself is relax/trainers/supervised.py.
"""

from __future__ import annotations

import torch

from relax.omni.processor import OmniProcessor
from relax.tasks import make_task
from relax.trainers.supervised import sampled_batches


def omni_batch(proc: OmniProcessor, tok, data, idx: list[int]) -> dict:
    items = [data[i] for i in idx]
    rows = proc.rows([{"media": p.meta["media"], "text": p.prompt} for p in items])
    rows["response_ids"] = [torch.tensor(tok.encode(p.answer, add_bos=False) + [tok.eos_token_id]) for p in items]
    return rows


def warmup_batches(tok, cfg):
    """`cfg.warmup.steps` packed batches (with media) of train prompts drawn by `cfg.seed`."""
    data = make_task(cfg.task, cfg.seed, "train")
    proc = OmniProcessor(tok)
    return sampled_batches(lambda idx: omni_batch(proc, tok, data, idx), len(data), cfg.warmup, cfg.seed,
                           tok.pad_token_id)


__all__ = ["omni_batch", "warmup_batches"]
