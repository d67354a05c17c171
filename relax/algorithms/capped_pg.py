"""Worked example of "add your own algorithm" (README): a capped importance-weighted policy gradient.

l_t = -sg(min(r_t, cap)) * A_t * logp_t, r_t = exp(logp_t - old_logp_t): every token keeps a gradient (unlike
PPO's clip, which zeroes it outside the trust region) but its importance weight is capped (CISPO-style).
One file, one decorator; `algorithm.policy_loss=capped_pg algorithm.params={cap: 2.0}` selects it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

CAPPED_PG_PARAMS = {"cap": 2.0}


@register_policy_loss("capped_pg", params=CAPPED_PG_PARAMS)
def capped_pg_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig,
                   *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    cap = read_params(cfg, CAPPED_PG_PARAMS)["cap"]
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    weight = t.ratio.clamp(max=cap).detach()
    loss = -weight * t.adv * log_probs
    metrics = {"capped_frac": float(masked_mean((weight >= cap).float(), mask)), **t.metrics}
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
