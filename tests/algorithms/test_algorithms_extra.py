"""The estimators, losses, aggregations and KL estimators added for issue 17, each against a hand-computed
value and gradient (pure torch, fast); the helpers are imported from tests/algorithms/test_algorithms.py."""

import math
from pathlib import Path

import pytest
import torch

from relax.algorithms import (
    AdvantageInput,
    LossScale,
    aggregate,
    check_config,
    get_advantage,
    kl_penalty,
    kl_reward,
)
from relax.algorithms.m2po import second_moment_mask
from relax.config import AlgorithmConfig, load_config
from test_algorithms import adv, close, loss_call, mask_of  # the same helpers, one copy

T = torch.tensor
LN = math.log
ROOT = Path(__file__).resolve().parents[2]


def _cfg(*overrides):
    return load_config(ROOT / "experiments/async/cpu.yaml", list(overrides))


# ---------------------------------------------------------------- aggregations

def test_empty_rows_count_in_no_denominator():
    loss = T([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [7.0, 7.0, 7.0]])
    mask = T([[1.0, 1, 1], [1, 0, 0], [0, 0, 0]])  # the third row has no loss token: no mean, not counted
    scale = LossScale.of(mask, norm_tokens=5)
    assert scale == LossScale(total_tokens=4, total_seqs=2, norm_tokens=5)
    close(aggregate(loss, mask, "token-mean", scale), 10 / 4)
    close(aggregate(loss, mask, "seq-mean-token-mean", scale), (2 + 4) / 2)
    close(aggregate(loss, mask, "seq-mean-token-sum", scale), (6 + 4) / 2)
    close(aggregate(loss, mask, "seq-mean-token-sum-norm", scale), 10 / (2 * 5))
    close(aggregate(loss, mask, "token-sum", scale), 10.0)


@pytest.mark.parametrize("mode, grad", [("token-sum", 1.0), ("seq-mean-token-sum-norm", 1 / (2 * 5))])
def test_new_aggregations_gradient(mode, grad):
    mask = T([[1.0, 1, 0], [1, 0, 0]])
    loss = torch.randn(2, 3, requires_grad=True)
    aggregate(loss, mask, mode, LossScale.of(mask, norm_tokens=5)).backward()
    close(loss.grad, grad * mask)  # every token weighs the same, whatever its response's length


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm", "token-sum"])
def test_unit_scale_then_denominator_is_the_true_scale(mode):
    # The Actor accumulates with LossScale(1, 1) and divides the gradients by scale.denominator(mode).
    torch.manual_seed(3)
    mask = mask_of([3, 1, 2, 0], 3)
    loss = torch.randn(4, 3)
    scale = LossScale.of(mask, norm_tokens=4)
    close(aggregate(loss, mask, mode, LossScale(1, 1)) / scale.denominator(mode), aggregate(loss, mask, mode, scale))


# ---------------------------------------------------------------- KL estimators

def test_kl_abs_and_straight_through_estimators():
    ref = T([[-1.0, -2.0]])
    for name, value in [("abs", [0.5, 0.3]), ("k1+", [0.5, -0.3]),
                        ("k3+", [math.exp(-0.5) + 0.5 - 1, math.exp(0.3) - 0.3 - 1])]:
        logp = T([[-0.5, -2.3]], requires_grad=True)
        k = kl_penalty(logp, ref, name)
        k.sum().backward()
        close(k, [value])
        # abs: sign(d); k1+ / k3+: k2's gradient d = log p - log q
        close(logp.grad, [[1.0, -1.0]] if name == "abs" else [[0.5, -0.3]])


def test_k3_is_clamped_like_verl():
    logp = T([[0.0, -30.0, -0.5]], requires_grad=True)
    ref = T([[-30.0, 0.0, 0.0]])
    k = kl_penalty(logp, ref, "k3")
    k.sum().backward()
    # log q - log p = -30 -> clamped to -20: e^-20 + 20 - 1 ~ 19 -> value clamp 10; +30 -> e^20 -> 10
    close(k, [[10.0, 10.0, math.exp(0.5) - 0.5 - 1]])
    close(logp.grad, [[0.0, 0.0, 1 - math.exp(0.5)]])  # the clamps cut the outliers' gradient


def test_kl_reward_is_the_negative_scaled_estimate_on_the_mask():
    rollout = T([[-0.5, -1.0, -3.0]], requires_grad=True)
    ref = T([[-1.0, -1.5, 0.0]])
    r = kl_reward(rollout, ref, T([[1.0, 1, 0]]), 0.1, "k1")
    close(r, [[-0.05, -0.05, 0.0]])
    assert not r.requires_grad


def test_kl_in_reward_config():
    assert AlgorithmConfig(kl_in_reward=True, kl_coef=0.1, kl_estimator="k1").kl_in_reward
    with pytest.raises(ValueError, match="kl_in_reward"):
        _cfg("algorithm.kl_in_reward=true", "algorithm.kl_coef=0")
    with pytest.raises(ValueError, match="kl_in_reward"):
        _cfg("algorithm.kl_in_reward=true", "schedule=verl")
    assert _cfg("algorithm.kl_in_reward=true").algorithm.kl_in_reward


# ---------------------------------------------------------------- advantage estimators

def test_reinforce_pp_hand_values():
    # gamma 0.5, R = [1, 0] on lengths 2, 1: G = [[.5, 1], [0]]; tokens [.5, 1, 0]: mean .5, unbiased std .5
    cfg = AlgorithmConfig(advantage="reinforce_pp", params={"gamma": 0.5})
    a, ret = adv("reinforce_pp", [1, 0], [0, 1], [2, 1], cfg)
    close(ret, [[0.5, 1.0], [0.0, 0.0]])
    close(a, [[0.0, 0.5 / (0.5 + 1e-6)], [-0.5 / (0.5 + 1e-6), 0.0]])  # (G - .5) / .5
    # the token rewards (KL-in-reward) join the reward-to-go before whitening: gamma 1, G = [[1+.2-.1, 1-.1], [0]]
    a, ret = adv("reinforce_pp", [1, 0], [0, 1], [2, 1], token_rewards=T([[0.2, -0.1], [0.0, 0.0]]))
    close(ret, [[1.1, 0.9], [0.0, 0.0]])


def test_remax_hand_values_and_needs_the_baseline():
    a, ret = adv("remax", [1, 0], [0, 1], [2, 1], baseline_rewards=T([0.5, 0.5]))
    close(ret, [[1.0, 1.0], [0.0, 0.0]])
    close(a, [[0.5, 0.5], [-0.5, 0.0]])
    with pytest.raises(ValueError, match="baseline_rewards"):
        adv("remax", [1, 0], [0, 1], [2, 1])


def test_opo_length_weighted_baseline():
    # group 0: R = [1, 0, 1] on lengths [1, 2, 3] -> b = (1 + 0 + 3) / 6 = 2/3; group 1 all equal -> 0
    a, _ = adv("opo", [1, 0, 1, 2, 2], [0, 0, 0, 1, 1], [1, 2, 3, 1, 1])
    close(a[:, 0], [1 / 3, -2 / 3, 1 / 3, 0.0, 0.0])
    close(a[2], [1 / 3] * 3)


def test_gpg_rescales_by_the_informative_fraction():
    # B = 4, M = 2 (group 1 is all-equal) -> alpha = 2; group 0 centred: [.5, -.5]
    a, _ = adv("gpg", [1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1])
    close(a[:, 0], [1.0, -1.0, 0.0, 0.0])
    a, _ = adv("gpg", [1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1], AlgorithmConfig(params={"gpg_f_norm": 2.0}))
    close(a[:, 0], [0.5, -0.5, 0.0, 0.0])


def test_grpo_passk_only_the_best_learns():
    # group 0: [0, 1, .5]: best 1, runner-up .5, unbiased std .5 -> A = 1 on the best; group 1 ties -> 0
    a, _ = adv("grpo_passk", [0, 1, 0.5, 1, 1], [0, 0, 0, 1, 1], [2, 2, 2, 1, 1])
    close(a[:, 0], [0.0, 0.5 / (0.5 + 1e-6), 0.0, 0.0, 0.0])
    close(a[1], [0.5 / (0.5 + 1e-6)] * 2)
    a, _ = adv("grpo_passk", [0, 1, 0.5], [0, 0, 0], [1, 1, 1], AlgorithmConfig(norm_adv_by_std=False))
    close(a[:, 0], [0.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="at least 2"):
        adv("grpo_passk", [1.0], [0], [1])


def test_reinforce_pp_baseline_subtracts_the_batch_mean_by_default():
    # group-centred tokens [.5, .5, -.5]: mean 1/6, unbiased std sqrt(1/3) (hand values as in test_algorithms)
    a, _ = adv("reinforce_pp_baseline", [1, 0], [0, 0], [2, 1])
    s = math.sqrt(1 / 3) + 1e-6
    close(a, [[(0.5 - 1 / 6) / s, (0.5 - 1 / 6) / s], [(-0.5 - 1 / 6) / s, 0.0]])


# ---------------------------------------------------------------- policy losses

def test_cispo_clips_the_weight_keeps_the_gradient():
    old = T([[-1.0, -1.0]])
    logp = old + T([[LN(1.5), LN(0.5)]])  # ratios 1.5 (above 1.28) and .5 (below .8)
    loss, g, m = loss_call("cispo", logp, old, T([[1.0, -1.0]]), T([[1.0, 1.0]]))
    close(loss, (-1.28 * logp[0, 0] + 0.8 * logp[0, 1]) / 2)
    close(g, [[-1.28 / 2, 0.8 / 2]])  # both tokens keep a gradient, weighted by the clipped ratio
    assert m["clip_frac"] == 1.0


@pytest.mark.parametrize("name", ["reinforce", "gpg"])
def test_reinforce_is_the_plain_policy_gradient(name):
    logp, old = T([[-0.5, -2.0, -1.0]]), T([[-3.0, -0.1, -1.0]])  # no ratio: the old log-probs do not matter
    loss, g, _ = loss_call(name, logp, old, T([[2.0, -1.0, 0.5]]), T([[1.0, 1.0, 0.0]]))
    close(loss, -(2.0 * -0.5 + -1.0 * -2.0) / 2)
    close(g, [[-1.0, 0.5, 0.0]])


def test_dro_quadratic_penalty():
    cfg = AlgorithmConfig(policy_loss="dro", params={"dro_beta": 0.1})
    loss, g, _ = loss_call("dro", T([[-1.0]]), T([[-1.5]]), T([[2.0]]), T([[1.0]]), cfg)
    close(loss, -(2.0 * -1.0 - 0.05 * 0.25))
    close(g, [[-(2.0 - 0.1 * 0.5)]])


def test_gmpo_geometric_mean_of_log_clipped_ratios():
    cfg = AlgorithmConfig(policy_loss="gmpo", loss_agg="seq-mean-token-mean")
    # A > 0, log r = [.1, .6]: the .6 is clipped to .4 (it would raise the objective): rho = e^((.1 + .4) / 2)
    old = T([[-1.0, -1.0]])
    loss, g, m = loss_call("gmpo", old + T([[0.1, 0.6]]), old, T([[1.0, 1.0]]), T([[1.0, 1.0]]), cfg)
    rho = math.exp(0.25)
    close(loss, -rho)
    close(g, [[-rho / 2, 0.0]])
    assert m["clip_frac"] == 0.5
    # A < 0, log r = [-.6, .1]: the -.6 is clipped to -.4: rho = e^((-.4 + .1) / 2), loss +rho
    loss, g, _ = loss_call("gmpo", old + T([[-0.6, 0.1]]), old, T([[-1.0, -1.0]]), T([[1.0, 1.0]]), cfg)
    rho = math.exp(-0.15)
    close(loss, rho)
    close(g, [[0.0, rho / 2]])


def test_m2po_masks_the_fewest_largest_outliers():
    # (log r)^2 = [0, .01, 1, .25]: mean .315 > .04; drop 1 -> .26/3 > .04; drop .25 -> .005 <= .04
    old = T([[-1.0, -1.0, -1.0, -1.0]])
    log_r = T([[0.0, 0.1, 1.0, -0.5]])
    mask = T([[1.0, 1, 1, 1]])
    assert second_moment_mask(log_r, mask, 0.04).tolist() == [[True, True, False, False]]
    loss, g, m = loss_call("m2po", old + log_r, old, T([[1.0, 1.0, 1.0, 1.0]]), mask)
    close(loss, -(1 + math.exp(0.1)) / 4)  # dropped tokens still count in token-mean's denominator
    close(g, [[-1 / 4, -math.exp(0.1) / 4, 0.0, 0.0]])
    assert m["m2po_masked_frac"] == 0.5
    # on-policy nothing is masked: the plain policy gradient
    loss, g, m = loss_call("m2po", old, old, T([[1.0, -1.0, 1.0, 0.0]]), mask)
    close(g, [[-0.25, 0.25, -0.25, 0.0]])
    assert m["m2po_masked_frac"] == 0.0


def test_m2po_mask_ignores_padding():
    log_r = T([[3.0, 0.1], [0.0, 5.0]])
    mask = T([[0.0, 1.0], [1.0, 0.0]])  # the big values sit on padding
    assert second_moment_mask(log_r, mask, 0.04).tolist() == [[False, True], [True, False]]


def test_new_names_pass_check_config():
    for advantage in ("reinforce_pp", "remax", "opo", "gpg", "grpo_passk"):
        check_config(AlgorithmConfig(advantage=advantage))
    for loss in ("cispo", "reinforce", "gpg", "dro", "gmpo", "m2po"):
        check_config(AlgorithmConfig(policy_loss=loss))
    check_config(AlgorithmConfig(policy_loss="m2po", params={"m2po_tau": 0.1}))
    with pytest.raises(ValueError, match="m2po_tau"):
        check_config(AlgorithmConfig(policy_loss="ppo", params={"m2po_tau": 0.1}))
    assert isinstance(get_advantage("opo")(AdvantageInput(T([1.0, 0.0]), T([0, 0]), T([[1.0], [1.0]])),
                                            AlgorithmConfig())[0], torch.Tensor)
