"""SAPO (soft adaptive policy optimisation): a smooth gate in place of PPO's hard clip.

    l_t = -f(r_t) A_t,   f(r) = (4 / tau) sigmoid(tau (r - 1)),   tau = params.tau_pos if A_t > 0 else tau_neg

f'(r) = 4 sigma (1 - sigma) = sech^2(tau (r - 1) / 2): 1 at r = 1 (on-policy: the plain policy gradient, like
PPO inside its clip range), falling smoothly and monotonically as r moves away from 1 instead of dropping to
0 at a boundary. The gradient w.r.t. logp_t is -A_t f'(r_t) r_t. tau_neg > tau_pos makes the gate decay faster
for negative advantages, whose off-policy updates are the less stable ones.

SAPO (Gao et al. 2025, arXiv 2511.20347) averages per sequence, then over sequences, and veRL's `sapo` always
aggregates by seq-mean-token-mean; ours follows `algorithm.loss_agg` like every loss (set
`loss_agg: seq-mean-token-mean` to match the paper and veRL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

SAPO_PARAMS = {"tau_pos": 1.0, "tau_neg": 1.05}


def sapo_gate(ratio: Tensor, tau: Tensor | float) -> Tensor:
    """f(r) = 4 / tau * sigmoid(tau (r - 1)); the 4 / tau makes f'(1) = 1."""
    return 4.0 / tau * torch.sigmoid(tau * (ratio - 1.0))


@register_policy_loss("sapo", params=SAPO_PARAMS)
def sapo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    loss_scale: LossScale,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """l_t = -(4 / tau_t) sigmoid(tau_t (r_t - 1)) A_t, tau_t = tau_pos if A_t > 0 else tau_neg."""
    p = read_params(cfg, SAPO_PARAMS)
    if p["tau_pos"] <= 0 or p["tau_neg"] <= 0:
        raise ValueError(f"algorithm.params.tau_pos/tau_neg must be > 0, got {p['tau_pos']}/{p['tau_neg']}")
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    adv, ratio = t.adv, t.ratio
    tau = torch.where(adv > 0, p["tau_pos"], p["tau_neg"])
    loss = -sapo_gate(ratio, tau) * adv
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        metrics = {"gate_mean": float(masked_mean(4 * s * (1 - s), mask)), **t.metrics}
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
