"""OPO, on-policy RL with the optimal baseline (Hao et al. 2025, arXiv 2505.23585; veRL's `opo`):

    A_i = R_i - b_g,   b_g = sum_{j in g} |y_j| R_j / sum_{j in g} |y_j|

the length-weighted mean reward of the group (the variance-minimising baseline when the gradient norm grows
with the response length), broadcast to every masked token (+ the token reward-to-go, as grpo); |y_j| counts
the masked tokens. Groups whose rewards are all equal, groups of one included, get exactly 0 (veRL uses the
baseline 0 for a group of one, i.e. A = R).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.advantages import REWARD_TO_GO_PARAMS, AdvantageInput, _broadcast, _check, _float
from relax.algorithms.groups import group_stats
from relax.algorithms.registry import register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_advantage("opo", params=REWARD_TO_GO_PARAMS)
def opo(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    _check(inp)
    r = _float(inp.rewards)
    length = (inp.response_mask > 0).sum(-1).to(r.dtype)
    g = group_stats(r, inp.group_index)
    # b_g = mean_g(|y| R) / mean_g(|y|): the group means of the two products give the weighted mean.
    baseline = group_stats(length * r, inp.group_index).mean / group_stats(length, inp.group_index).mean.clamp(min=1)
    adv = (r - baseline).masked_fill(g.degenerate, 0.0)
    adv = _broadcast(adv, inp, cfg)
    return adv, adv
