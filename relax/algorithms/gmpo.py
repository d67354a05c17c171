"""GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673; veRL's `geo_mean`): the
sequence ratio is the geometric mean of token ratios, each clipped in log space.

    d_it = sgn(A_i) min(sgn(A_i) log r_it, sgn(A_i) clip(log r_it, -eps_low, eps_high))
    rho_i = exp( (1/|y_i|) sum_t d_it ),   l_i = -A_i rho_i

A_i = the token-mean of the advantages over response i (the broadcast scalar for sequence-level estimators);
l_i is placed on every token of response i and reduced by `algorithm.loss_agg`: with seq-mean-token-mean it is
the paper's 1/G sum_i (veRL always takes the plain mean over rows). The pessimistic min clips a token only when
it would raise the objective, like PPO's clip, but the geometric mean lets one outlier token move rho_i far less
than the arithmetic mean of GRPO would. eps_low / eps_high = params.gmpo_clip_low / gmpo_clip_high, default 0.4
each (the paper's range (e^-0.4, e^0.4)); veRL uses the actor's clip ratios there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.aggregation import LossScale, masked_mean
from relax.algorithms.policy import policy_terms, reduce_policy_loss
from relax.algorithms.registry import read_params, register_policy_loss

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

GMPO_PARAMS = {"gmpo_clip_low": 0.4, "gmpo_clip_high": 0.4}


@register_policy_loss("gmpo", params=GMPO_PARAMS)
def gmpo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig,
              *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    p = read_params(cfg, GMPO_PARAMS)
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    m = mask > 0
    n = m.sum(-1).clamp(min=1)
    adv = torch.where(m, t.adv, 0.0).sum(-1) / n
    sgn = torch.sign(adv)[:, None]
    clipped = t.log_r.clamp(-p["gmpo_clip_low"], p["gmpo_clip_high"])
    d = sgn * torch.minimum(sgn * t.log_r, sgn * clipped)
    rho = torch.exp(torch.where(m, d, 0.0).sum(-1) / n)
    seq_loss = -adv * rho
    with torch.no_grad():
        metrics = {"clip_frac": float(masked_mean((d != t.log_r) & (sgn != 0), m)),
                   "seq_ratio_mean": float(masked_mean(rho, m.any(-1))), **t.metrics}
    loss = seq_loss[:, None].expand(mask.shape)
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
