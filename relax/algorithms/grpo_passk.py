"""GRPO for pass@k (veRL's `grpo_passk`, after Chen et al. 2025, arXiv 2503.19595): only the best response of
each group learns, by its margin over the runner-up.

    A_i = (R_(1) - R_(2)) / (std_g R + eps)  for i = argmax_g R,  0 for every other i

R_(1) >= R_(2) are the group's two largest rewards, std the unbiased group std (dropped with
cfg.norm_adv_by_std false). A tie at the top gives 0, so which of the tied is the argmax does not matter.
Groups need at least two responses. Broadcast to every masked token (+ the token reward-to-go, as grpo).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.advantages import EPS, REWARD_TO_GO_PARAMS, AdvantageInput, _broadcast, _check, _float
from relax.algorithms.groups import group_stats
from relax.algorithms.registry import register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig


@register_advantage("grpo_passk", params=REWARD_TO_GO_PARAMS)
def grpo_passk(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    _check(inp)
    r = _float(inp.rewards)
    g = group_stats(r, inp.group_index)
    adv = torch.zeros_like(r)
    for gid in torch.unique(inp.group_index):
        idx = (inp.group_index == gid).nonzero().squeeze(-1)
        if idx.numel() < 2:
            raise ValueError(f"advantage 'grpo_passk' needs at least 2 responses per group; group {int(gid)} has 1")
        top, pos = torch.topk(r[idx], 2)
        margin = top[0] - top[1]
        if cfg.norm_adv_by_std:
            margin = margin / (g.std[idx[0]] + EPS)
        adv[idx[pos[0]]] = margin
    adv = _broadcast(adv, inp, cfg)
    return adv, adv
