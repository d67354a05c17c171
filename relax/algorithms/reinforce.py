"""REINFORCE (Williams 1992) / GPG's loss (Chu et al. 2025; veRL's `gpg` policy loss): the plain policy gradient.

    l_t = -A_t log p_t        gradient -A_t grad log p_t

No importance ratio and no clip: it is the on-policy gradient whatever the data's age, so off-policy data
(async, old_log_probs != log_probs) is not corrected except by `params.tis` (truncated importance sampling
against the rollout's log-probs). Registered as `reinforce` and, for GPG users, `gpg`: one function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.aggregation import LossScale
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_policy_loss("gpg")
@register_policy_loss("reinforce")
def reinforce_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor,
                   cfg: AlgorithmConfig, *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    t = policy_terms(log_probs, old_log_probs, advantages, mask)  # for the ratio metrics only
    return reduce_policy_loss(-t.adv * log_probs.float(), mask, cfg, loss_scale, old_log_probs, rollout_log_probs,
                              t.metrics)
