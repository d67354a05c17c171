"""Rollout correction: truncated importance sampling (TIS) for the gap between the rollout engine's
log-probs and the trainer's (kernel/precision mismatch, and staleness in async mode).

    w_t = min(exp(old_logp_t - rollout_logp_t), C),   C = params.tis_cap

The weight is detached: it re-weights the samples, it is not something to optimise.
"""

from __future__ import annotations

import torch
from torch import Tensor

TIS_PARAMS = {"tis": False, "tis_cap": 2.0}


def tis_weight(old_log_probs: Tensor, rollout_log_probs: Tensor, cap: float) -> Tensor:
    """min(exp(old_logp - rollout_logp), cap), detached, [B, T]."""
    if cap <= 0:
        raise ValueError(f"algorithm.params.tis_cap must be > 0, got {cap}")
    # exp may overflow to inf for a huge gap; the clamp brings it back to the cap.
    return torch.exp(old_log_probs.detach().float() - rollout_log_probs.detach().float()).clamp(max=cap)
