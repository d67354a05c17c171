"""Loss aggregation over masked tokens, exact under micro-batch gradient accumulation.

Every mode divides by a denominator of the whole training-step batch (`LossScale`), never by the
micro-batch's own count, so the sum of `aggregate` over the micro-batches of a step equals `aggregate`
of the full batch (sequences are never split across micro-batches). N_seqs counts the sequences with at
least one loss token: a row whose mask is empty has no mean and adds nothing, to the sum or the count
(as in veRL's agg_loss):

    token-mean               sum_{i,t} m_it l_it / N_tokens
    seq-mean-token-mean      sum_i (sum_t m_it l_it / sum_t m_it) / N_seqs
    seq-mean-token-sum       sum_i  sum_t m_it l_it / N_seqs
    seq-mean-token-sum-norm  sum_i  sum_t m_it l_it / (N_seqs L)     Dr. GRPO (Liu et al. 2025): a constant L
    token-sum                sum_{i,t} m_it l_it                      no normaliser

L (`LossScale.norm_tokens`) is `algorithm.loss_norm_tokens`, else `rollout.max_new_tokens` (Dr. GRPO's
MAX_TOKENS, the generation budget): every token then weighs the same whatever its response's length or the
batch's. veRL's `seq-mean-token-sum-norm` divides the micro-batch's token sum by L alone (no 1/N_seqs), with
L = the micro-batch's padded width unless `loss_scale_factor` is set; ours is the paper's 1/(G L).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")


@dataclass(frozen=True)
class LossScale:
    """Denominators of the whole step batch (summed over data-parallel ranks too, when there are any)."""

    total_tokens: int  # masked tokens (token-mean)
    total_seqs: int  # sequences with at least one masked token (seq-mean-*)
    norm_tokens: int = 1  # L, the constant of seq-mean-token-sum-norm

    @classmethod
    def of(cls, mask: Tensor, norm_tokens: int = 1) -> LossScale:
        """The scale of a step batch given its full [B, T] mask."""
        m = mask > 0
        return cls(total_tokens=int(m.sum()), total_seqs=int(m.any(-1).sum()), norm_tokens=norm_tokens)

    def denominator(self, mode: str) -> float:
        """What `mode` divides the masked sum by: aggregate(x, scale) = aggregate(x, unit) / scale.denominator
        for the unit scale LossScale(1, 1), which is how the Actor accumulates and then divides the gradients."""
        if mode == "token-mean":
            return max(self.total_tokens, 1)
        if mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
            return max(self.total_seqs, 1)
        if mode == "seq-mean-token-sum-norm":
            return max(self.total_seqs, 1) * max(self.norm_tokens, 1)
        if mode == "token-sum":
            return 1
        raise ValueError(f"unknown loss_agg {mode!r}; known: {', '.join(AGG_MODES)}")


def aggregate(loss_mat: Tensor, mask: Tensor, mode: str, scale: LossScale) -> Tensor:
    """Scalar loss from per-token `loss_mat` [B, T] over `mask` [B, T] (formulas in the module doc)."""
    m = mask > 0
    # where(), not multiply: padding may hold inf/nan (e.g. log-probs of pad tokens) and 0 * inf = nan.
    per_token = torch.where(m, loss_mat, 0.0)
    denom = scale.denominator(mode)  # also rejects an unknown mode
    if mode == "seq-mean-token-mean":
        # An empty row's sum is 0, so it adds nothing; the clamp only avoids 0 / 0.
        return (per_token.sum(-1) / m.sum(-1).clamp(min=1)).sum() / denom
    return per_token.sum() / denom


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of `x` over `mask` (0 when the mask is empty)."""
    m = mask > 0
    return torch.where(m, x, 0.0).sum() / m.sum().clamp(min=1)
