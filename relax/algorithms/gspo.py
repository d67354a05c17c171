"""GSPO (Zheng et al. 2025): a sequence-level importance ratio, the length-normalised likelihood ratio

    s_i = exp( (1/|y_i|) sum_t (logp_it - old_logp_it) )      over the masked tokens of response i,

clipped with a much smaller range than PPO's (params.gspo_clip_low / gspo_clip_high, default 3e-4 / 4e-4).
With cfg.loss_agg = "seq-mean-token-mean" both losses reproduce the paper's objective 1/G sum_i; other modes
weight each sequence's loss as that mode weights its tokens.

Names against veRL: our `gspo` is the paper's sequence-level objective (one clipped ratio s_i per response);
veRL's `gspo` is our `gspo_token` (token-level advantages allowed, the same gradient as ours when A_it is
constant over the response). veRL always aggregates GSPO by seq-mean-token-mean and clamps log s_it at 10;
ours follow `algorithm.loss_agg` (set seq-mean-token-mean to match) and clamp log s_i at +-20.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import LOG_RATIO_CLAMP, clipped_surrogate, policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

GSPO_PARAMS = {"gspo_clip_low": 3e-4, "gspo_clip_high": 4e-4}


def sequence_log_ratio(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> Tensor:
    """log s_i = mean over masked t of (logp_it - old_logp_it), [B] (0 for an empty response), clamped to +-20."""
    m = mask > 0
    diff = torch.where(m, log_probs.float() - old_log_probs.detach().float(), 0.0)
    return (diff.sum(-1) / m.sum(-1).clamp(min=1)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@register_policy_loss("gspo", params=GSPO_PARAMS)
def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    loss_scale: LossScale,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """l_i = max(-s_i A_i, -clip(s_i, 1 - eps_low, 1 + eps_high) A_i), A_i = token-mean of the advantages over the
    response (the broadcast scalar for sequence-level estimators); l_i is placed on every token of response i."""
    p = read_params(cfg, GSPO_PARAMS)
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    m = mask > 0
    adv = torch.where(m, t.adv, 0.0).sum(-1) / m.sum(-1).clamp(min=1)
    seq_log_r = sequence_log_ratio(log_probs, old_log_probs, mask)
    seq_loss, clipped = clipped_surrogate(seq_log_r.exp(), adv, p["gspo_clip_low"], p["gspo_clip_high"])
    has_tokens = m.any(-1)
    metrics = {
        "clip_frac": float(masked_mean(clipped.float(), has_tokens)),
        "seq_ratio_mean": float(masked_mean(seq_log_r.detach().exp(), has_tokens)),
        **t.metrics,
    }
    loss = seq_loss[:, None].expand(mask.shape)
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)


@register_policy_loss("gspo_token", params=GSPO_PARAMS)
def gspo_token_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    loss_scale: LossScale,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO-token: s_it = sg[s_i] * exp(logp_it - sg[logp_it]) (numerically s_i, gradient that of logp_it),
    l_it = max(-s_it A_it, -clip(s_it, 1 - eps_low, 1 + eps_high) A_it): token-level advantages allowed; equal to
    GSPO's gradient when A_it is constant over the response and loss_agg = seq-mean-token-mean."""
    p = read_params(cfg, GSPO_PARAMS)
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    lp = log_probs.float()
    seq_log_r = sequence_log_ratio(log_probs, old_log_probs, mask).detach()
    ratio = torch.exp(seq_log_r[:, None] + lp - lp.detach())
    loss, clipped = clipped_surrogate(ratio, t.adv, p["gspo_clip_low"], p["gspo_clip_high"])
    metrics = {
        "clip_frac": float(masked_mean(clipped.float(), mask)),
        "seq_ratio_mean": float(masked_mean(seq_log_r.exp(), (mask > 0).any(-1))),
        **t.metrics,
    }
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
