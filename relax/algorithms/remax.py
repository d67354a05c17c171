"""ReMax (Li et al. 2023, arXiv 2310.10505; veRL's `remax`): the baseline is the reward of the greedy response.

    A_it = G_it - b_i,   G_it = sum_{s >= t} r_is (reward-to-go, gamma = 1),   b_i = R(greedy response to x_i)

r_t = token_rewards_t plus the sequence reward on the last masked token; returns = G. The greedy baseline
comes in `AdvantageInput.baseline_rewards` [B]: one greedy (temperature 0) generation per prompt, scored by
the task's reward, repeated for every sampled response of the prompt: the Rollout generates it
(`TorchEngine.greedy`, one call per chunk of groups, or per group when streaming) and writes the row field `baseline_rewards`, which
Advantages reads. The greedy response itself is never trained on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.advantages import AdvantageInput, _check, _float, _gae, _token_rewards
from relax.algorithms.registry import register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_advantage("remax")
def remax(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    _check(inp)
    if inp.baseline_rewards is None:
        raise ValueError("advantage 'remax' needs AdvantageInput.baseline_rewards (the reward of a greedy response "
                         "per prompt): the bus field the Rollout writes when algorithm.advantage is 'remax'")
    mask = inp.response_mask > 0
    rewards = _token_rewards(inp, mask, with_sequence_reward=True)
    returns = _gae(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    baseline = _float(inp.baseline_rewards).to(returns.dtype)
    return torch.where(mask, returns - baseline[:, None], 0.0), returns
