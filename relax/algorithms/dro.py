"""DRO, direct reward optimisation (Richemond et al. 2024, arXiv 2405.19107; Kimi k1.5, arXiv 2501.12599; the
form of Tinker's `dro` loss): a policy gradient with a quadratic penalty on the log-ratio instead of a clip.

    l_t = -( A_t log p_t - (beta / 2) (log p_t - old_log p_t)^2 )
    gradient  -(A_t - beta (log p_t - old_log p_t)) grad log p_t

On-policy (log p = old_log p) it is REINFORCE; as the policy moves away from the data the penalty pulls it
back, so it stays usable off-policy. beta = params.dro_beta (default 0.05). The DRO papers pair it with a
soft advantage (R - tau log Z, a learned or sampled value); here A is whatever `algorithm.advantage` gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.aggregation import LossScale
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

DRO_PARAMS = {"dro_beta": 0.05}


@register_policy_loss("dro", params=DRO_PARAMS)
def dro_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig,
             *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    beta = read_params(cfg, DRO_PARAMS)["dro_beta"]
    if beta < 0:
        raise ValueError(f"algorithm.params.dro_beta must be >= 0, got {beta}")
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    loss = -(t.adv * log_probs.float() - 0.5 * beta * t.log_r.square())
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, t.metrics)
