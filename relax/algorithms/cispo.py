"""CISPO (MiniMax-M1, MiniMax 2025, arXiv 2506.13585; veRL's `cispo`): clip the importance weight, not the update.

    l_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) A_t log p_t,   r_t = exp(log p_t - old_log p_t)

Every token keeps its gradient -w_t A_t grad log p_t (PPO's clip zeroes it outside the trust region, dropping
the rare high-ratio "fork" tokens); only the weight w_t is bounded. clip_low / clip_high are
`algorithm.clip_low` / `clip_high`, as in veRL; MiniMax-M1 bounds only the top (set clip_low to 1 or more
for that: the weight is then never raised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_policy_loss("cispo")
def cispo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig,
               *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    clipped = t.ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high).detach()
    loss = -clipped * t.adv * log_probs.float()
    metrics = {"clip_frac": float(masked_mean((clipped != t.ratio.detach()).float(), mask)), **t.metrics}
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
