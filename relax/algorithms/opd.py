"""On-policy distillation: the student samples, a teacher scores each sampled token, and the per-token
advantage is the negative reverse-KL sample  -coef * (log pi_student(y_t) - log pi_teacher(y_t)).

Put `opd_token_advantage(...)` into `AdvantageInput.token_rewards` (params.gamma = 0 keeps it per token, no
reward-to-go), optionally alongside a task reward; the "opd" loss is the plain importance-weighted policy
gradient on whatever advantage results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.aggregation import LossScale
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


def opd_token_advantage(student_logp: Tensor, teacher_logp: Tensor, coef: float) -> Tensor:
    """-coef * (student_logp - teacher_logp), detached, [B, T]: positive where the teacher likes the token more."""
    return (-coef * (student_logp.float() - teacher_logp.float())).detach()


@register_policy_loss("opd", params={"opd_coef": 1.0, "task_reward": True})  # read by relax/roles/teacher.py
def opd_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgorithmConfig,
    *,
    loss_scale: LossScale,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """l_t = -r_t A_t, r_t = exp(logp_t - old_logp_t); its gradient -A_t r_t grad logp_t is the policy gradient
    (-A_t grad logp_t on-policy), so it is exactly 0 with its gradient when every A_t = 0 (student == teacher,
    no task reward)."""
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    return reduce_policy_loss(-t.ratio * t.adv, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, t.metrics)
