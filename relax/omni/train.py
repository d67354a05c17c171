"""Supervised warm-up batches of omni tasks (relax.models.warmup trains on them when `task.kind` is omni).

prompt = media placeholders + question text, target = the answer + EOS; the media fields go to the forward
(the encoders and projectors learn here). The loop itself is relax/trainers/supervised.py.
"""

from __future__ import annotations

import random

import torch

from relax.omni.processor import OmniProcessor
from relax.tasks import make_task
from relax.trainers.supervised import noisy_answer, sampled_batches


def omni_batch(proc: OmniProcessor, tok, data, idx: list[int], answer=lambda a: a) -> dict:
    """The rows of items `idx`; `answer` maps each item's answer to the target trained on."""
    items = [data[i] for i in idx]
    rows = proc.rows([{"media": p.meta["media"], "text": p.prompt} for p in items])
    rows["response_ids"] = [torch.tensor(tok.encode(answer(p.answer), add_bos=False) + [tok.eos_token_id])
                            for p in items]
    return rows


def warmup_batches(tok, cfg):
    """`cfg.warmup.steps` packed batches (with media) of train prompts drawn by `cfg.seed`; a `warmup.label_noise`
    share of the targets a demonstrator's wrong answer (relax.trainers.supervised.noisy_answer), as for text."""
    data = make_task(cfg.task, cfg.seed, "train")
    proc = OmniProcessor(tok)
    w = cfg.warmup
    rng = random.Random(f"{cfg.seed}-label-noise")  # its own stream: the drawn rows do not depend on the noise

    def answer(a: str) -> str:
        if w.label_noise and rng.random() < w.label_noise:
            return noisy_answer(a, rng, w.label_noise_offsets, lead="")
        return a

    return sampled_batches(lambda idx: omni_batch(proc, tok, data, idx, answer), len(data), w, cfg.seed,
                           tok.pad_token_id)


__all__ = ["omni_batch", "warmup_batches"]
