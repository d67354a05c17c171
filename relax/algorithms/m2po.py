"""M2PO, second-moment trust policy optimisation (Zheng et al. 2025, arXiv 2510.01161; shipped by Relax and AReaL):
instead of clipping every token outside a ratio range, mask only the extreme outliers.

    M2 = mean over unmasked tokens of (log r_t)^2,   r_t = exp(log p_t - old_log p_t)
    mask: drop the tokens with the largest (log r_t)^2, fewest first, until M2 of the rest <= tau
    l_t = -M_t r_t A_t            (M_t = 1 on kept tokens, 0 on dropped ones; no clip)

tau = params.m2po_tau (default 0.04, the paper's). Dropped tokens still count in token-mean's denominator, as
in the paper's 1 / sum_i |o_i|. The paper takes M2 over the whole training batch; a loss here sees one
micro-batch, so the mask is chosen per micro-batch (the same when the step is one micro-batch). On-policy
(log p = old_log p at the first update) nothing is masked and it is the plain policy gradient.
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

M2PO_PARAMS = {"m2po_tau": 0.04}


@torch.no_grad()
def second_moment_mask(log_r: Tensor, mask: Tensor, tau: float) -> Tensor:
    """Bool [B, T]: the masked tokens kept once the fewest largest (log r)^2 are dropped to bring their mean <= tau."""
    m = mask > 0
    sq = log_r.detach().float().square()[m]
    n = sq.numel()
    keep = torch.zeros_like(m)
    if n == 0:
        return keep
    order = torch.argsort(sq, descending=True)
    s = sq[order]
    # mean of the rest after dropping the k largest, k = 0..n-1: (total - sum of the k largest) / (n - k)
    dropped = torch.cat([s.new_zeros(1), s.cumsum(0)[:-1]])
    rest_mean = (s.sum() - dropped) / (n - torch.arange(n, dtype=s.dtype))
    ok = (rest_mean <= tau).nonzero()
    k = int(ok[0]) if ok.numel() else n
    kept = torch.ones(n, dtype=torch.bool)
    kept[order[:k]] = False
    keep[m] = kept
    return keep


@register_policy_loss("m2po", params=M2PO_PARAMS)
def m2po_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor, cfg: AlgorithmConfig,
              *, loss_scale: LossScale, rollout_log_probs: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    tau = read_params(cfg, M2PO_PARAMS)["m2po_tau"]
    if tau <= 0:
        raise ValueError(f"algorithm.params.m2po_tau must be > 0, got {tau}")
    t = policy_terms(log_probs, old_log_probs, advantages, mask)
    keep = second_moment_mask(t.log_r, mask, tau)
    loss = torch.where(keep, -t.ratio * t.adv, 0.0)
    metrics = {"m2po_masked_frac": float(masked_mean((~keep).float(), mask)),
               "m2": float(masked_mean(t.log_r.detach().square(), mask)), **t.metrics}
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, metrics)
