"""Per-token KL estimators between the policy p and the reference q, from sampled tokens (Schulman, 2020):

    k1  = log p - log q                               unbiased, high variance, can be negative
    abs = |log p - log q|                             biased, >= 0
    k2  = 0.5 (log p - log q)^2                       biased, low variance, >= 0
    k3  = exp(log q - log p) - (log q - log p) - 1    unbiased, low variance, >= 0
    k1+, k3+: the value of k1 / k3, the gradient of k2 (straight-through: k2 - sg(k2) + sg(k))

k3 clamps log q - log p to +-20 and its value to [-10, 10], as veRL does: exp overflows otherwise, and a
token whose KL estimate exceeds 10 nats is an outlier whose gradient is cut. The `+` forms exist because k1
and k3 have the right expected value but not the right expected gradient as a loss; k2's gradient,
(log p - log q) grad log p, is the unbiased gradient of KL(p || q) on samples of p (veRL's `k1+`, `k3+`).

As a loss term (`algorithm.kl_in_reward: false`): `loss + kl_coef * aggregate(kl_penalty(logp, ref_logp,
kl_estimator), mask, ...)`. In the reward (`kl_in_reward: true`): `kl_reward` is the per-token reward
-kl_coef * kl_penalty(rollout_logp, ref_logp, kl_estimator), detached, which the Advantages role puts into
`AdvantageInput.token_rewards` (veRL's use_kl_in_reward, whose usual estimator is k1).
"""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k3+")
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, estimator: str) -> Tensor:
    """[B, T] KL estimate per token; differentiable through both arguments."""
    d = log_probs.float() - ref_log_probs.float()  # log p - log q
    if estimator.endswith("+") and estimator in KL_ESTIMATORS:
        forward = kl_penalty(log_probs, ref_log_probs, estimator[:-1]).detach()
        k2 = 0.5 * d.square()
        return k2 - k2.detach() + forward
    if estimator == "k1":
        return d
    if estimator == "abs":
        return d.abs()
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        neg = (-d).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)  # log q - log p
        return (torch.exp(neg) - neg - 1).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)
    raise ValueError(f"unknown kl estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")


def kl_reward(rollout_log_probs: Tensor, ref_log_probs: Tensor, mask: Tensor, coef: float, estimator: str) -> Tensor:
    """-coef * KL estimate per token on the masked tokens, detached, [B, T]: KL as a reward penalty. The tokens
    were sampled by the rollout policy, so its log-probs are the p of the estimate."""
    kl = kl_penalty(rollout_log_probs.detach(), ref_log_probs.detach(), estimator)
    return torch.where(mask > 0, -coef * kl, 0.0).detach()
