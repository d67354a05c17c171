"""Continuous batching for the torch engine: a finished sequence leaves the batch at once and a waiting
request joins at the next decode step, so the batch stays full however long the tail of response lengths.

Rows are always left-padded: a joining request is prefilled on its own (its prompt left-padded to the longest
joining prompt), then the two KV caches are left-padded to one length and concatenated along the batch. The
KV columns no live row attends to any more are cropped, and a finished row's KV rows are dropped at once.
Positions come from each row's own length, so padding changes no logits (as in `TorchEngine._generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from relax.engines.feed import Feed


@dataclass
class _Row:
    index: int  # the request's number (the order the feed gave it)
    limit: int  # its max_new_tokens
    first_version: int = -1  # the weight version of its first token (partial rollout: versions change mid-request)
    last_version: int = -1  # ... and of its last
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)


def _pad_left(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - x.shape[dim]
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class ContinuousBatch:
    """The live batch: per-layer KV tensors [B, heads, T, head_dim], the attention mask [B, T], each row's
    next position and last token."""

    def __init__(self):
        self.rows: list[_Row] = []
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.attn = torch.zeros((0, 0), dtype=torch.long)
        self.pos = torch.zeros(0, dtype=torch.long)
        self.last = torch.zeros(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def kv_rows(self) -> int:
        """Batch rows the KV cache holds (freed as sequences finish)."""
        return self.kv[0][0].shape[0] if self.kv else 0

    def cache(self) -> DynamicCache:
        return DynamicCache(ddp_cache_data=self.kv)

    def take_cache(self, cache: DynamicCache) -> None:
        self.kv = [(layer.keys, layer.values) for layer in cache.layers]

    def join(self, rows: list[_Row], kv, attn: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> None:
        if not self.rows:
            self.rows, self.kv, self.attn, self.pos, self.last = rows, kv, attn, pos, last
            return
        T = max(self.attn.shape[1], attn.shape[1])
        self.kv = [(torch.cat([_pad_left(k0, T, 2), _pad_left(k1, T, 2)]), torch.cat([_pad_left(v0, T, 2), _pad_left(v1, T, 2)]))
                   for (k0, v0), (k1, v1) in zip(self.kv, kv)]
        self.attn = torch.cat([_pad_left(self.attn, T, 1), _pad_left(attn, T, 1)])
        self.rows += rows
        self.pos, self.last = torch.cat([self.pos, pos]), torch.cat([self.last, last])

    def keep(self, keep: list[int]) -> None:
        """Drop every row not in `keep` (their KV rows are freed), then the KV columns no row attends to."""
        if len(keep) == len(self.rows):
            return
        idx = torch.tensor(keep, dtype=torch.long)
        self.rows = [self.rows[i] for i in keep]
        self.attn, self.pos, self.last = self.attn[idx], self.pos[idx], self.last[idx]
        self.kv = [(k[idx], v[idx]) for k, v in self.kv]
        if not self.rows:
            self.kv, self.attn = [], torch.zeros((0, 0), dtype=torch.long)
            return
        lead = int((self.attn.sum(0) == 0).long().cumprod(0).sum())  # leading columns padded in every row
        if lead:
            self.attn = self.attn[:, lead:]
            self.kv = [(k[:, :, lead:], v[:, :, lead:]) for k, v in self.kv]


def continuous_generate(model, feed: Feed, max_batch: int, pad: int, eos: int,
                        sample: Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, torch.Tensor]],
                        wait: Callable[[], None] = lambda: None,
                        on_step: Callable[[ContinuousBatch], None] = lambda b: None,
                        version: Callable[[], int] = lambda: 0) -> Iterator[_Row]:
    """Yields each request's row (number, tokens, log_probs, first/last weight version) as soon as it
    finishes (EOS or its limit), with at most `max_batch` sequences decoding at once; `feed` (relax/engines/
    feed.py) is asked for new requests whenever a slot is free, and the call ends once the batch is empty and
    the feed gives nothing. `sample(logits [B, V], request numbers [B]) -> (tokens, log-probs)` (the numbers
    let a server sample each request with its own settings); `wait()` is called before every
    forward (the engine's pause, and where a partial rollout loads a new version: in-flight rows go on with it,
    their KV cache kept); `version()` is the weights' version at that moment; `on_step(batch)` after each step
    (tests)."""
    prompts: list[list[int]] = []
    batch = ContinuousBatch()
    while True:
        if batch:  # one decode step for every live row
            wait()
            batch.attn = torch.cat([batch.attn, torch.ones((len(batch), 1), dtype=torch.long)], dim=1)
            out = model(input_ids=batch.last[:, None], attention_mask=batch.attn, position_ids=batch.pos[:, None],
                        past_key_values=batch.cache(), use_cache=True)
            batch.take_cache(out.past_key_values)
            tok, lp = sample(out.logits[:, -1], [r.index for r in batch.rows])
            v = version()
            for r, t, x in zip(batch.rows, tok.tolist(), lp.tolist()):
                r.tokens.append(t)
                r.log_probs.append(x)
                r.last_version = v
            batch.pos, batch.last = batch.pos + 1, tok
        free = max_batch - len(batch)
        new = feed(free) if free else []
        if not new and not batch:
            return
        if new:  # join: prefill the requests the feed gave, sample their first token
            rows = []
            for p, limit in new:
                rows.append(_Row(len(prompts), limit))
                prompts.append(p)
            L = max(len(prompts[r.index]) for r in rows)
            ids = torch.full((len(rows), L), pad, dtype=torch.long)
            attn = torch.zeros((len(rows), L), dtype=torch.long)
            for j, r in enumerate(rows):
                p = prompts[r.index]
                ids[j, L - len(p):] = torch.tensor(p)
                attn[j, L - len(p):] = 1
            wait()
            out = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp_(min=0),
                        use_cache=True)
            tok, lp = sample(out.logits[:, -1], [r.index for r in rows])
            v = version()
            for r, t, x in zip(rows, tok.tolist(), lp.tolist()):
                r.tokens.append(t)
                r.log_probs.append(x)
                r.first_version = r.last_version = v
            batch.join(rows, [(layer.keys, layer.values) for layer in out.past_key_values.layers], attn,
                       attn.sum(-1), tok)
        on_step(batch)
        keep = []
        for i, r in enumerate(batch.rows):
            if r.tokens[-1] == eos or len(r.tokens) >= r.limit:
                yield r
            else:
                keep.append(i)
        batch.keep(keep)
