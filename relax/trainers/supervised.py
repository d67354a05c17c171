"""The supervised loop (SFT warm-up): AdamW steps of masked NLL over batches its caller supplies.

It knows no task. The warm-up of each task kind supplies `(Packed, media)` batches: text pairs
(relax/models/warmup.py, which also caches the result), omni media + text (relax/omni/train.py), tool-using
episodes with a loss mask (relax/agent/train.py). The forward is the trainer's own (`token_log_probs`), so
the warm-up and RL see the model through the same code.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator

import torch
from tqdm import tqdm

from relax.trainers.batching import Packed, media_rows, pack
from relax.trainers.torch_trainer import token_log_probs


def supervised_loop(model, w, batches: Iterable[tuple[Packed, list[dict] | None]], desc: str,
                    progress: bool) -> list[float]:
    """`w.steps` supervised steps over `batches` ((packed, media) pairs): AdamW with a 20-step linear warm-up
    then linear decay, on `w.threads` threads; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / w.steps))
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(w.threads)
    try:
        return [sft_step(model, opt, sched, packed, media)
                for packed, media in tqdm(batches, total=w.steps, desc=desc, disable=not progress)]
    finally:
        torch.set_num_threads(threads)


def sft_step(model, opt, sched, packed: Packed, media: list[dict] | None = None) -> float:
    """One supervised step: mean NLL of the packed rows' masked (response) tokens, clipped at 1.0; returns the loss."""
    lp = token_log_probs(model, packed, 1.0, media)
    loss = -(lp * packed.mask).sum() / packed.mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def noisy_answer(target: str, rng: random.Random, offsets: list[int] | None = None, lead: str = " ") -> str:
    """A warm-up demonstrator's plausible wrong answer: the number moved by one of `offsets` (None: -2, -1, +1, +2),
    written after `lead`; a target that is not a number stays as it is."""
    try:
        return f"{lead}{int(target) + rng.choice(offsets or [-2, -1, 1, 2])}"
    except ValueError:
        return target


def sampled_batches(rows_of: Callable[[list[int]], dict], size: int, w, seed: int,
                    pad_id: int) -> Iterator[tuple[Packed, list[dict] | None]]:
    """`w.steps` batches of `w.batch_size` row indices drawn uniformly (with replacement, `Random(seed)`) from
    [0, size); `rows_of(idx)` gives their `prompt_ids`, `response_ids` and any `loss_mask` and media fields."""
    rng = random.Random(seed)
    for _ in range(w.steps):
        rows = rows_of([rng.randrange(size) for _ in range(w.batch_size)])
        yield pack(rows["prompt_ids"], rows["response_ids"], pad_id, rows.get("loss_mask")), media_rows(rows)


__all__ = ["noisy_answer", "sampled_batches", "sft_step", "supervised_loop"]
