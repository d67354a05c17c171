"""Advantage estimators. Each returns (advantages, returns), both [B, T] and zero outside the mask.

Sequence-level estimators (grpo, rloo, reinforce_pp_baseline here; opo, gpg, grpo_passk in their own modules)
compute one scalar per response from the group's rewards and broadcast it to every masked token; returns =
advantages (there is no critic). reinforce_pp and remax (own modules) use the reward-to-go below instead.
`token_rewards` (KL-in-reward, an OPD term): sequence-level estimators add their discounted reward-to-go
G_t = sum_{s>=t} gamma^(s-t) tr_s to the broadcast scalar (gamma = params.gamma, default 1.0; gamma=0 keeps
each token's own term, the zero discount of on-policy distillation); GAE takes r_t = tr_t plus the sequence
reward on the last masked token. Masked-out positions inside a response (e.g. tool output) are skipped by
the recursions, not treated as time steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from relax.algorithms.groups import group_stats
from relax.algorithms.registry import read_params, register_advantage

if TYPE_CHECKING:
    from relax.config import AlgorithmConfig

EPS = 1e-6
REWARD_TO_GO_PARAMS = {"gamma": 1.0}
GAE_PARAMS = {"gamma": 1.0, "lam": 0.95}


@dataclass
class AdvantageInput:
    rewards: Tensor  # [B] sequence-level scalar reward per response
    group_index: Tensor  # [B] int; equal values = responses to one prompt (a GRPO group)
    response_mask: Tensor  # [B, T] 1 on response tokens that count (loss mask), right-padded
    values: Tensor | None = None  # [B, T] critic values (GAE)
    token_rewards: Tensor | None = None  # [B, T] extra per-token rewards (KL-in-reward, OPD term)
    baseline_rewards: Tensor | None = None  # [B] reward of a greedy response to the same prompt (ReMax)


def _float(x: Tensor) -> Tensor:
    return (x if x.is_floating_point() else x.float()).detach()


def _gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """A_t = delta_t + gamma lam A_{t+1}, delta_t = r_t + gamma V_{t+1} - V_t, where t+1 is the next
    masked position (V = A = 0 past the end). values=0, lam=1 gives the discounted reward-to-go."""
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    next_adv = rewards.new_zeros(B)
    next_value = rewards.new_zeros(B)
    for t in reversed(range(T)):
        keep = mask[:, t]
        a = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        next_adv = torch.where(keep, a, next_adv)
        next_value = torch.where(keep, values[:, t], next_value)
        adv[:, t] = torch.where(keep, a, 0.0)
    return adv


def _masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / (std + eps) over masked entries (unbiased std); without shift_mean only x / (std + eps)."""
    n = mask.sum()
    mean = torch.where(mask, x, 0.0).sum() / n.clamp(min=1)
    var = torch.where(mask, (x - mean).square(), 0.0).sum() / (n - 1).clamp(min=1)
    out = (x - mean if shift_mean else x) / (var.sqrt() + EPS)
    return torch.where(mask, out, 0.0)


def _token_rewards(inp: AdvantageInput, mask: Tensor, with_sequence_reward: bool) -> Tensor:
    """Per-token reward matrix: token_rewards on masked tokens (+ the sequence reward on the last one)."""
    r = _float(inp.rewards).new_zeros(mask.shape)
    if inp.token_rewards is not None:
        r = torch.where(mask, _float(inp.token_rewards).to(r.dtype), 0.0)
    if with_sequence_reward:
        T = mask.shape[1]
        last = T - 1 - mask.flip(1).int().argmax(1)  # index of the last masked token
        has_tokens = mask.any(1)
        r[has_tokens, last[has_tokens]] += _float(inp.rewards).to(r.dtype)[has_tokens]
    return r


def _broadcast(seq_adv: Tensor, inp: AdvantageInput, cfg: AlgorithmConfig) -> Tensor:
    """Sequence scalar on every masked token, plus the reward-to-go of token_rewards if any."""
    mask = inp.response_mask > 0
    adv = torch.where(mask, seq_adv[:, None], 0.0)
    if inp.token_rewards is not None:
        gamma = read_params(cfg, REWARD_TO_GO_PARAMS)["gamma"]
        zeros = torch.zeros_like(adv)
        adv = adv + _gae(_token_rewards(inp, mask, with_sequence_reward=False), zeros, mask, gamma, 1.0)
    return adv


def _check(inp: AdvantageInput) -> None:
    B = inp.rewards.shape[0]
    if inp.rewards.dim() != 1 or inp.response_mask.dim() != 2 or inp.response_mask.shape[0] != B:
        raise ValueError(
            f"rewards must be [B] and response_mask [B, T]; got {tuple(inp.rewards.shape)}, "
            f"{tuple(inp.response_mask.shape)}"
        )
    for name in ("values", "token_rewards"):
        x = getattr(inp, name)
        if x is not None and x.shape != inp.response_mask.shape:
            raise ValueError(f"{name} {tuple(x.shape)} must match response_mask {tuple(inp.response_mask.shape)}")
    if inp.baseline_rewards is not None and inp.baseline_rewards.shape != inp.rewards.shape:
        raise ValueError(f"baseline_rewards {tuple(inp.baseline_rewards.shape)} must match rewards "
                         f"{tuple(inp.rewards.shape)}")


@register_advantage("grpo", params=REWARD_TO_GO_PARAMS)
def grpo(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """A_i = (R_i - mean_g R) / (std_g R + eps) with cfg.norm_adv_by_std (GRPO), else R_i - mean_g R
    (Dr. GRPO, which drops the std division as a difficulty bias). std is the unbiased group std."""
    _check(inp)
    r = _float(inp.rewards)
    g = group_stats(r, inp.group_index)
    adv = r - g.mean
    if cfg.norm_adv_by_std:
        adv = adv / (g.std + EPS)
    # Exactly 0, not rounding noise / eps, for groups without signal.
    adv = adv.masked_fill(g.degenerate, 0.0)
    adv = _broadcast(adv, inp, cfg)
    return adv, adv


@register_advantage("rloo", params=REWARD_TO_GO_PARAMS)
def rloo(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """A_i = R_i - (sum_{j in g, j != i} R_j) / (n_g - 1): the leave-one-out baseline (Ahmadian et al. 2024)."""
    _check(inp)
    r = _float(inp.rewards)
    g = group_stats(r, inp.group_index)
    adv = r - (g.mean * g.size - r) / (g.size - 1).clamp(min=1)
    adv = adv.masked_fill(g.degenerate, 0.0)
    adv = _broadcast(adv, inp, cfg)
    return adv, adv


RPP_BASELINE_PARAMS = {**REWARD_TO_GO_PARAMS, "shift_mean": True}


@register_advantage("reinforce_pp_baseline", params=RPP_BASELINE_PARAMS)
def reinforce_pp_baseline(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262): A'_it = R_i - mean_g R (+ token reward-to-go),
    then A_it = (A'_it - mean_batch(A')) / (std_batch(A') + eps), mean and std over all masked tokens of the
    batch (with cfg.norm_adv_by_std), as the paper and veRL's reinforce_plus_plus_baseline.

    The batch-mean shift gives equal-reward groups (A' = 0) a nonzero, length-dependent push -mean/std;
    params.shift_mean = false whitens without it (x / std only), which keeps those groups at exactly 0.
    """
    _check(inp)
    p = read_params(cfg, RPP_BASELINE_PARAMS)
    r = _float(inp.rewards)
    g = group_stats(r, inp.group_index)
    adv = _broadcast((r - g.mean).masked_fill(g.degenerate, 0.0), inp, cfg)
    if cfg.norm_adv_by_std:
        adv = _masked_whiten(adv, inp.response_mask > 0, shift_mean=bool(p["shift_mean"]))
    return adv, adv


@register_advantage("gae", params=GAE_PARAMS)
def gae(inp: AdvantageInput, cfg: AlgorithmConfig) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2016): r_t = token_rewards_t (+ R on the last token), delta_t = r_t + gamma V_{t+1}
    - V_t, A_t = sum_l (gamma lam)^l delta_{t+l}; returns = A + V (critic targets, before whitening); the
    advantages are then whitened over all masked tokens of the batch, as in PPO."""
    _check(inp)
    if inp.values is None:
        raise ValueError("advantage 'gae' needs AdvantageInput.values (a critic)")
    p = read_params(cfg, GAE_PARAMS)
    mask = inp.response_mask > 0
    values = torch.where(mask, _float(inp.values), 0.0)
    rewards = _token_rewards(inp, mask, with_sequence_reward=True).to(values.dtype)
    adv = _gae(rewards, values, mask, p["gamma"], p["lam"])
    returns = torch.where(mask, adv + values, 0.0)
    return _masked_whiten(adv, mask), returns
