"""Per-token KL estimators between the policy p and the reference q, from sampled tokens (Schulman, 2020):

    k1 = log p - log q                               unbiased, high variance, can be negative
    k2 = 0.5 (log p - log q)^2                       biased, low variance, >= 0
    k3 = exp(log q - log p) - (log q - log p) - 1    unbiased, low variance, >= 0

As a loss term: `loss + cfg.kl_coef * aggregate(kl_penalty(logp, ref_logp, cfg.kl_estimator), mask, ...)`.
In the reward: `AdvantageInput(token_rewards=-cfg.kl_coef * kl_penalty(old_logp, ref_logp, "k1"), ...)`.
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, estimator: str) -> Tensor:
    """[B, T] KL estimate per token; differentiable through both arguments."""
    d = log_probs.float() - ref_log_probs.float()  # log p - log q
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(-d) + d - 1
    raise ValueError(f"unknown kl estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")
