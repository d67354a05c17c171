"""Batching shared by every trainer: prompt + response rows packed right-padded, micro-batches cut by token budget.

`pack` builds the `Packed` rows the torch forward reads (`mask` 1 on the tokens to train and score: the
response, or the rows' `loss_mask`); `relax.trainers.budget.budget_slices` cuts a list of rows into consecutive
micro-batches whose padded size fits a token budget (the torch and Megatron trainers, the Critic); `media_rows` hands
the rows' media feature fields (relax/omni/) to a model's forward as per-row dicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MEDIA_FIELDS = ("image_patches", "audio_mel", "video_frames")  # relax/omni/processor.py FIELDS


def media_rows(rows: dict, sl: slice = slice(None)) -> list[dict] | None:
    """Per-row media dicts of `rows[sl]` for a model's `media=` argument (None when no media field is present)."""
    names = [f for f in MEDIA_FIELDS if f in rows]
    if not names:
        return None
    n = len(rows[names[0]][sl])
    return [{f: rows[f][sl][i] for f in names} for i in range(n)]


@dataclass
class Packed:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    resp_pos: torch.Tensor  # [B, T] positions of the logits that predict each response token
    resp_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float, 1 on real response tokens


def pad_right(seqs: list[torch.Tensor], value: float = 0.0, dtype=None) -> torch.Tensor:
    T = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(T, 1)), value, dtype=dtype or seqs[0].dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def pack(prompts: list[torch.Tensor], responses: list[torch.Tensor], pad_id: int,
         loss_masks: list[torch.Tensor] | None = None) -> Packed:
    """Right-padded prompt + response rows; `mask` is 1 on response tokens, or `loss_masks[i]` where given."""
    B = len(prompts)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    T = max(max(len(r) for r in responses), 1)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    rid = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n, m = len(p), len(r)
        ids[i, :n] = p
        ids[i, n : n + m] = r
        attn[i, : n + m] = 1
        pos[i, :m] = torch.arange(n - 1, n + m - 1)
        rid[i, :m] = r
        if loss_masks is None:
            mask[i, :m] = 1.0
        else:
            if len(loss_masks[i]) != m:
                raise ValueError(f"row {i}: loss_mask has {len(loss_masks[i])} entries for {m} response tokens")
            mask[i, :m] = torch.as_tensor(loss_masks[i], dtype=torch.float32)
    return Packed(ids, attn, pos, rid, mask)
