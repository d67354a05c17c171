"""REINFORCE++ (Hu et al. 2025, arXiv 2501.03262; veRL's `reinforce_plus_plus`): no critic, no group baseline.

    r_t = token_rewards_t (+ R on the last masked token),   G_t = sum_{s >= t} gamma^(s-t) r_s
    A_t = (G_t - mean_batch G) / (std_batch G + eps),       returns = G

The discounted reward-to-go is whitened over every masked token of the batch (the Advantages batch: the
groups the role is handed at once). With `algorithm.kl_in_reward` the token rewards hold -kl_coef * KL, the
paper's "KL-to-go"; masked-out positions inside a response (tool output) are skipped by the recursion.
gamma = params.gamma (default 1.0, veRL's default too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.advantages import (
    REWARD_TO_GO_PARAMS,
    AdvantageInput,
    _check,
    _gae,
    _masked_whiten,
    _token_rewards,
)
from relax.algorithms.registry import read_params, register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_advantage("reinforce_pp", params=REWARD_TO_GO_PARAMS)
def reinforce_pp(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    _check(inp)
    gamma = read_params(cfg, REWARD_TO_GO_PARAMS)["gamma"]
    mask = inp.response_mask > 0
    rewards = _token_rewards(inp, mask, with_sequence_reward=True)
    returns = _gae(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)
    return _masked_whiten(returns, mask), returns
