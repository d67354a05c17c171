"""The R3 bus field, built from an engine's per-row routing record.

An engine (the torch engine with routing capture, or SGLang's `return_routed_experts`) gives, per row, the
experts of every token it was fed: `[prompt_len + completion_len - 1, layers, k]`. On the bus that becomes one
field, `rollout_routed_experts`, uint8 (int16 beyond 254 experts) `[T, layers, k]` per row:
  * with `moe.r3_prompt` (default): T = prompt_len + completion_len, entry j <-> token j of prompt ++ response;
  * without: T = completion_len, entry t <-> response token t (the prompt is routed by the trainer).
The last entry is NOT_ROUTED: the final token was never fed to the engine, and no trained log-prob depends on
its routing. One field (not one per part) keeps the bus's per-field cost down. Bytes per sample = T * layers * k.
"""

from __future__ import annotations

import numpy as np
import torch

from relax.moe.capture import NOT_ROUTED, route_dtype

ROUTED_FIELD = "rollout_routed_experts"


def r3_fields(cfg) -> list[str]:
    """The routing fields a trainer or log-prob role reads under `cfg` (none when R3 is off)."""
    moe = getattr(cfg, "moe", None)
    return [ROUTED_FIELD] if moe is not None and moe.r3 else []


def routing_fields(records: list, prompt_lens: list[int], response_lens: list[int], num_experts: int,
                   with_prompt: bool = True) -> dict[str, list[torch.Tensor]]:
    """The bus field from one engine record per row (tensor or numpy array [prompt + response - 1, layers, k])."""
    dtype = route_dtype(num_experts)
    out = []
    end = None
    for i, (rec, p, m) in enumerate(zip(records, prompt_lens, response_lens)):
        rec = torch.from_numpy(np.ascontiguousarray(rec)) if isinstance(rec, np.ndarray) else rec
        if rec.dim() != 3 or rec.shape[0] != p + m - 1:
            raise ValueError(f"routed experts of row {i}: expected [{p + m - 1}, layers, k] for a {p}-token prompt "
                             f"and {m}-token response, got {list(rec.shape)}")
        if end is None or end.shape[1:] != rec.shape[1:]:
            end = torch.full((1, *rec.shape[1:]), NOT_ROUTED[dtype], dtype=dtype)
        if not with_prompt:
            rec = rec[p:] if m else rec[:0]
        out.append(torch.cat([rec.to(dtype), end]) if with_prompt or m else rec.to(dtype))
    return {ROUTED_FIELD: out}


def bytes_per_sample(fields: dict[str, list[torch.Tensor]]) -> float:
    """Mean payload bytes the routing fields add per row."""
    rows = len(next(iter(fields.values())))
    total = sum(t.numel() * t.element_size() for v in fields.values() for t in v)
    return total / max(rows, 1)
