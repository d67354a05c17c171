"""GPG, group policy gradient (Chu et al. 2025, arXiv 2504.02546): group-centred rewards, rescaled for the
responses that carry no signal.

    A_i = alpha (R_i - mean_g R) / F_norm,   alpha = B / (B - M)

M = responses in groups whose rewards are all equal (their A is 0), B = responses in the batch (the
Advantages batch: the groups the role is handed at once), F_norm = params.gpg_f_norm (default 1; the paper
also allows the group std). alpha makes the batch-mean gradient the mean over the informative responses.
Pair it with the `gpg` policy loss (-A_t log p_t, relax/algorithms/reinforce.py).

veRL's `gpg` estimator takes M' = the responses with a nonzero raw reward and alpha = B / M' instead, which
for 0/1 rewards counts correct answers rather than informative responses; ours follows the paper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from relax.algorithms.advantages import REWARD_TO_GO_PARAMS, AdvantageInput, _broadcast, _check, _float
from relax.algorithms.groups import group_stats
from relax.algorithms.registry import read_params, register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

GPG_PARAMS = {**REWARD_TO_GO_PARAMS, "gpg_f_norm": 1.0}


@register_advantage("gpg", params=GPG_PARAMS)
def gpg(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    _check(inp)
    p = read_params(cfg, GPG_PARAMS)
    if p["gpg_f_norm"] <= 0:
        raise ValueError(f"algorithm.params.gpg_f_norm must be > 0, got {p['gpg_f_norm']}")
    r = _float(inp.rewards)
    g = group_stats(r, inp.group_index)
    informative = int((~g.degenerate).sum())
    alpha = r.shape[0] / max(informative, 1)
    adv = (alpha * (r - g.mean) / p["gpg_f_norm"]).masked_fill(g.degenerate, 0.0)
    adv = _broadcast(adv, inp, cfg)
    return adv, adv
