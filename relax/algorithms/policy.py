"""Pieces every policy loss shares: the importance ratio, the clipped surrogate, ratio metrics, and the
final reduction (rollout correction, then aggregation by cfg.loss_agg over the whole step batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.aggregation import LossScale, aggregate, masked_mean
from relax.algorithms.correction import TIS_PARAMS, tis_weight
from relax.algorithms.registry import read_params

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

# Clamp before exp: an overflow to inf becomes inf * 0 = nan in backward. exp(20) ~ 5e8 is far outside any
# clip range, so no value that matters changes.
LOG_RATIO_CLAMP = 20.0


def log_ratio(log_probs: Tensor, old_log_probs: Tensor) -> Tensor:
    """log r_t = logp_t - old_logp_t in float32, clamped to +-20; differentiable through log_probs."""
    return (log_probs.float() - old_log_probs.detach().float()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def clipped_surrogate(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """PPO's pessimistic bound l = max(-r A, -clip(r, 1-low, 1+high) A) and where the clipped branch is active
    (there the gradient is 0)."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - low, 1 + high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@torch.no_grad()
def ratio_metrics(log_r: Tensor, mask: Tensor) -> dict[str, float]:
    """ratio_mean/max and approx_kl = mean(r - 1 - log r), the k3 estimate of KL(old || new)."""
    r = log_r.exp()
    m = mask > 0
    return {
        "ratio_mean": float(masked_mean(r, m)),
        "ratio_max": float(r[m].max()) if m.any() else 1.0,
        "approx_kl": float(masked_mean(r - 1 - log_r, m)),
    }


@dataclass(frozen=True)
class PolicyTerms:
    """What every policy loss starts from: detached float32 advantages, the token log-ratio and ratio (with
    their gradient through log_probs), and the ratio metrics (ratio_mean/max, approx_kl) over the mask."""

    adv: Tensor
    log_r: Tensor
    ratio: Tensor
    metrics: dict[str, float]


def policy_terms(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor) -> PolicyTerms:
    """The shared preamble of every built-in policy loss: see PolicyTerms."""
    log_r = log_ratio(log_probs, old_log_probs)
    return PolicyTerms(advantages.detach().float(), log_r, log_r.exp(), ratio_metrics(log_r, mask))


def reduce_policy_loss(
    loss_mat: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    loss_scale: LossScale,
    old_log_probs: Tensor,
    rollout_log_probs: Tensor | None,
    metrics: dict[str, float],
) -> tuple[Tensor, dict[str, float]]:
    """Per-token loss [B, T] -> scalar: times the TIS weight (params.tis and rollout_log_probs given), then
    aggregate(…, cfg.loss_agg, loss_scale). Returns (loss, metrics with the TIS metrics added)."""
    p = read_params(cfg, TIS_PARAMS)
    if p["tis"] and rollout_log_probs is not None:
        w = tis_weight(old_log_probs, rollout_log_probs, p["tis_cap"])
        loss_mat = loss_mat * w
        metrics["tis_weight_mean"] = float(masked_mean(w, mask))
        metrics["tis_capped_frac"] = float(masked_mean((w >= p["tis_cap"]).float(), mask))
    return aggregate(loss_mat, mask, cfg.loss_agg, loss_scale), metrics
