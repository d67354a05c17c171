"""Loss aggregation over masked tokens, exact under micro-batch gradient accumulation.

Every mode divides by a denominator of the whole training-step batch (`LossScale`), never by the
micro-batch's own count, so the sum of `aggregate` over the micro-batches of a step equals `aggregate`
of the full batch (sequences are never split across micro-batches):

    token-mean           sum_{i,t} m_it l_it / N_tokens
    seq-mean-token-mean  sum_i (sum_t m_it l_it / sum_t m_it) / N_seqs
    seq-mean-token-sum   sum_i  sum_t m_it l_it / N_seqs
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


@dataclass(frozen=True)
class LossScale:
    """Denominators of the whole step batch (summed over data-parallel ranks too, when there are any)."""

    total_tokens: int  # masked tokens (token-mean)
    total_seqs: int  # sequences (seq-mean-*)

    @classmethod
    def of(cls, mask: Tensor) -> LossScale:
        """The scale of a step batch given its full [B, T] mask."""
        return cls(total_tokens=int((mask > 0).sum()), total_seqs=mask.shape[0])


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str, scale: LossScale) -> Tensor:
    """Scalar loss from per-token `loss_mat` [B, T] over `mask` [B, T] (formulas in the module doc)."""
    m = mask > 0
    # where(), not multiply: padding may hold inf/nan (e.g. log-probs of pad tokens) and 0 * inf = nan.
    per_token = torch.where(m, loss_mat, 0.0)
    if mode == "token-mean":
        return per_token.sum() / max(scale.total_tokens, 1)
    per_seq = per_token.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(-1).clamp(min=1)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss_agg {mode!r}; known: {', '.join(AGG_MODES)}")
    return per_seq.sum() / max(scale.total_seqs, 1)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of `x` over `mask` (0 when the mask is empty)."""
    m = mask > 0
    return torch.where(m, x, 0.0).sum() / m.sum().clamp(min=1)
