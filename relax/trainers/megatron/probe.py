"""A fixed probe batch for checking a Megatron trainer against the torch trainer (the CPU and GPU tests): three
short arithmetic prompts, random responses from a seeded generator, and a micro-batch with advantages +1, -1 and
0.5 whose old log-probs are the reference trainer's (ratios 1)."""

from __future__ import annotations

import torch

PROMPTS = ("What is 3 + 4? Answer:", "12-5=", "7*6 is")


def probe_batch(tok, seed: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.tensor(tok.encode(s)) for s in PROMPTS]
    responses = [torch.randint(3, 90, (n,), generator=gen) for n in (7, 4, 9)]
    return prompts, responses


def probe_micro_batch(prompts, responses, old_log_probs) -> dict:
    return {"prompt_ids": prompts, "response_ids": responses, "old_log_probs": [a.clone() for a in old_log_probs],
            "advantages": [torch.full((len(r),), a) for r, a in zip(responses, (1.0, -1.0, 0.5))]}
