"""PPO clipped surrogate with decoupled clip ranges (DAPO clip-higher) and optional dual-clip."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import clipped_surrogate, policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

PPO_PARAMS = {"clip_ratio_c": None}


@register_policy_loss("ppo", params=PPO_PARAMS)
def ppo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    loss_scale: LossScale,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """l_t = max(-r_t A_t, -clip(r_t, 1 - cfg.clip_low, 1 + cfg.clip_high) A_t), r_t = exp(logp_t - old_logp_t).

    Dual-clip (Ye et al. 2020), when params.clip_ratio_c = c > 1: for A_t < 0, l_t = min(l_t, -c A_t), which
    bounds the loss of a negative-advantage token whose ratio has run far above 1.

    Deliberately PPO's objective (Schulman et al. 2017) by default: dual-clip is off. veRL's `vanilla` loss
    always applies it with c = 3.0; `algorithm.params.clip_ratio_c: 3.0` gives veRL's loss.
    """
    c = read_params(cfg, PPO_PARAMS)["clip_ratio_c"]
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    adv = t.adv
    loss, clipped = clipped_surrogate(t.ratio, adv, cfg.clip_low, cfg.clip_high)
    metrics = {"clip_frac": float(masked_mean(clipped.float(), mask)), **t.metrics}
    if c is not None:
        if c <= 1:
            raise ValueError(f"algorithm.params.clip_ratio_c must be > 1, got {c}")
        dual = (adv < 0) & (loss > -c * adv)
        loss = torch.where(dual, -c * adv, loss)
        metrics["dual_clip_frac"] = float(masked_mean(dual.float(), mask))
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
