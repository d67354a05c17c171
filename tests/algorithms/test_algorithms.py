"""The algorithm suite against hand-computed values and gradients, plus its invariants (pure torch, fast)."""

import math

import pytest
import torch

from relax.algorithms import (
    AdvantageInput,
    LossScale,
    aggregate,
    check_config,
    filter_groups,
    get_advantage,
    get_policy_loss,
    kl_penalty,
    known_policy_losses,
    log_ratio,
    opd_token_advantage,
    read_params,
    reduce_policy_loss,
    register_policy_loss,
    sapo_gate,
    sequence_log_ratio,
    tis_weight,
)
from relax.config import AlgorithmConfig

T = torch.tensor


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, rtol=tol)


def mask_of(lengths, T_=None):
    T_ = T_ or max(lengths)
    return (torch.arange(T_)[None, :] < T(lengths)[:, None]).float()


def adv(name, rewards, groups, lengths, cfg=None, **extra):
    inp = AdvantageInput(rewards=T(rewards, dtype=torch.float32), group_index=T(groups),
                         response_mask=mask_of(lengths), **extra)
    return get_advantage(name)(inp, cfg or AlgorithmConfig())


def loss_call(name, logp, old, a, mask, cfg=None, rollout=None):
    """Run a policy loss; returns (loss, d loss / d logp, metrics)."""
    f32 = lambda x: torch.as_tensor(x, dtype=torch.float32)  # noqa: E731
    logp, mask = f32(logp).clone().requires_grad_(), f32(mask)
    loss, metrics = get_policy_loss(name)(logp, f32(old), f32(a), mask,
                                          cfg or AlgorithmConfig(), loss_scale=LossScale.of(mask),
                                          rollout_log_probs=rollout)
    loss.backward()
    return loss.detach(), logp.grad, metrics


# ---------------------------------------------------------------- advantage estimators

def test_grpo_one_group_hand_values():
    # rewards [1,0,0,1]: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3) -> A = +-0.5 / (sqrt(1/3) + 1e-6)
    a, ret = adv("grpo", [1, 0, 0, 1], [7, 7, 7, 7], [2, 1, 3, 1])
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024...
    close(a, [[s, s, 0], [-s, 0, 0], [-s, -s, -s], [s, 0, 0]])
    close(ret, a)


def test_grpo_two_groups_and_dr_grpo():
    # group 0: [1, 0] -> std sqrt(0.5), A = +-0.5/0.70711 = +-0.70711; group 1: [2, 2, 2] -> 0
    a, _ = adv("grpo", [1, 0, 2, 2, 2], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1])
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(a[:, 0], [s, -s, 0, 0, 0])
    # norm_adv_by_std=False (Dr. GRPO): only the group mean is subtracted.
    a, _ = adv("grpo", [1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], AlgorithmConfig(norm_adv_by_std=False))
    close(a[:, 0], [0.5, -0.5, -0.5, 0.5])


def test_rloo_hand_values():
    # A_i = R_i - mean of the others: [1,0,0,1] -> 1 - 1/3, 0 - 2/3, ...; [3,1,2] -> 3-1.5, 1-2.5, 2-2
    a, _ = adv("rloo", [1, 0, 0, 1, 3, 1, 2], [0, 0, 0, 0, 1, 1, 1], [1] * 7)
    close(a[:, 0], [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0.0])


def test_reinforce_pp_baseline_hand_values():
    # group-centred: [0.5, -0.5] on lengths 2 and 1 -> tokens [.5, .5, -.5]; their unbiased std:
    # mean 1/6, var = ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3 -> A = +-0.5 / (sqrt(1/3) + 1e-6) with shift_mean off
    # (the default, with the batch mean subtracted as in veRL: tests/algorithms/test_algorithms_extra.py).
    a, _ = adv("reinforce_pp_baseline", [1, 0], [0, 0], [2, 1], AlgorithmConfig(params={"shift_mean": False}))
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(a, [[s, s], [-s, 0]])
    # An equal-reward group contributes zeros (which do count in the batch std; the batch mean is 0 here):
    # tokens [.5, .5, -.5, -.5, 0, 0]: var = 1 / 5 -> A = +-0.5 / sqrt(0.2)
    a, _ = adv("reinforce_pp_baseline", [1, 0, 3, 3], [0, 0, 1, 1], [2, 2, 1, 1])
    s = 0.5 / (math.sqrt(0.2) + 1e-6)
    close(a, [[s, s], [-s, -s], [0, 0], [0, 0]])


def test_gae_hand_values():
    # gamma 1, lam 0.5, V = [.5, .4, .2], R = 1 on the last token:
    # delta = [0 + .4 - .5, 0 + .2 - .4, 1 + 0 - .2] = [-.1, -.2, .8]; A2 = .8, A1 = -.2 + .5*.8 = .2, A0 = -.1 + .5*.2 = 0
    cfg = AlgorithmConfig(advantage="gae", params={"gamma": 1.0, "lam": 0.5})
    a, ret = adv("gae", [1.0], [0], [3], cfg, values=T([[0.5, 0.4, 0.2]]))
    raw = T([0.0, 0.2, 0.8])
    close(ret, [[0.5, 0.6, 1.0]])  # A + V, before whitening
    close(a[0], (raw - raw.mean()) / (raw.std() + 1e-6))  # whitened over the masked tokens


def test_gae_discount_skips_masked_positions():
    # mask [1, 0, 1, 0]: position 1 (e.g. a tool output) and 3 (padding) are not time steps, their values unused.
    # gamma .5, lam .5, V = [.1, 9, .3, 7], R = 1 at t=2: delta2 = 1 - .3 = .7, A2 = .7;
    # delta0 = .5 * .3 - .1 = .05 (V of t=2, the next step), A0 = .05 + .25 * .7 = .225; returns = A + V
    cfg = AlgorithmConfig(params={"gamma": 0.5, "lam": 0.5})
    inp = AdvantageInput(rewards=T([1.0, 0.0]), group_index=T([0, 1]), response_mask=T([[1.0, 0, 1, 0], [1, 1, 1, 1]]),
                         values=T([[0.1, 9.0, 0.3, 7.0], [0.0, 0.0, 0.0, 0.0]]))
    _, ret = get_advantage("gae")(inp, cfg)
    close(ret[0], [0.325, 0, 1.0, 0])
    with pytest.raises(ValueError, match="values"):
        get_advantage("gae")(AdvantageInput(T([1.0]), T([0]), torch.ones(1, 2)), cfg)


def test_token_rewards_reward_to_go():
    # equal rewards -> sequence part 0; token_rewards [1, 2, 4] -> gamma 1: [7, 6, 4]; gamma 0: [1, 2, 4]
    tr = T([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0]])
    a, _ = adv("grpo", [1, 1], [0, 0], [3, 2], token_rewards=tr)
    close(a, [[7, 6, 4], [3, 2, 0]])
    a, _ = adv("rloo", [1, 1], [0, 0], [3, 2], AlgorithmConfig(params={"gamma": 0.0}), token_rewards=tr)
    close(a, [[1, 2, 4], [1, 2, 0]])
    # GAE: the token rewards join R on the last token. gamma = lam = 1, V = 0: returns = reward-to-go [8, 7, 5]
    _, ret = adv("gae", [1], [0], [3], AlgorithmConfig(params={"lam": 1.0}), token_rewards=tr[:1],
                 values=torch.zeros(1, 3))
    close(ret, [[8, 7, 5]])


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_pp_baseline"])
def test_equal_reward_groups_get_exactly_zero(name):
    # In float32 the mean of three 0.9s is not 0.9: the zero must not come out as rounding noise / eps.
    a, _ = adv(name, [0.9, 0.9, 0.9, 0.7, 0.3, 5.0], [0, 0, 0, 1, 1, 2], [2, 3, 1, 2, 2, 1])
    assert torch.equal(a[[0, 1, 2, 5]], torch.zeros(4, 3))  # the singleton group 2 too
    assert (a[3:5] != 0).any()


def test_advantages_zero_outside_mask():
    for name in ["grpo", "rloo", "reinforce_pp_baseline"]:
        a, r = adv(name, [1, 0, 3, 1], [0, 0, 1, 1], [1, 3, 2, 3])
        m = mask_of([1, 3, 2, 3])
        assert torch.equal(a * (1 - m), torch.zeros_like(a)) and torch.equal(r * (1 - m), torch.zeros_like(r))


def test_filter_groups():
    keep = filter_groups(T([1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0]), T([0, 0, 1, 1, 2, 3, 3]))
    assert keep.tolist() == [True, True, False, False, False, False, False]


# ---------------------------------------------------------------- policy losses

def test_ppo_two_tokens_one_clipped():
    # old = 0; r = [1.5, 0.9], A = 1, clip [0.8, 1.28]: token 0 clipped -> loss -1.28, gradient 0;
    # token 1 inside -> loss -0.9, d/dlogp = -A r = -0.9. token-mean over 2 tokens.
    loss, g, m = loss_call("ppo", [[math.log(1.5), math.log(0.9)]], [[0.0, 0.0]], [[1.0, 1.0]], [[1, 1]])
    close(loss, (-1.28 - 0.9) / 2)
    close(g, [[0.0, -0.9 / 2]])
    close(m["clip_frac"], 0.5)
    close(m["ratio_mean"], 1.2)


def test_ppo_clip_low_high_are_separate_and_dual_clip():
    # A = -1: r = 0.75 < 1 - clip_low (0.8) -> clipped, loss 0.8, grad 0; r = 1.25 < 1 + clip_high -> 1.25, grad -A r
    loss, g, _ = loss_call("ppo", [[math.log(0.75), math.log(1.25)]], [[0.0, 0.0]], [[-1.0, -1.0]], [[1, 1]])
    close(loss, (0.8 + 1.25) / 2)
    close(g, [[0.0, 1.25 / 2]])
    # dual-clip c = 3, A = -1, r = 5: the clipped surrogate gives max(5, 1.28) = 5, dual-clip caps at 3, grad 0;
    # r = 2 stays at 2 (below c) with grad -A r = 2.
    cfg = AlgorithmConfig(params={"clip_ratio_c": 3.0})
    loss, g, m = loss_call("ppo", [[math.log(5.0), math.log(2.0)]], [[0.0, 0.0]], [[-1.0, -1.0]], [[1, 1]], cfg)
    close(loss, (3.0 + 2.0) / 2)
    close(g, [[0.0, 2.0 / 2]])
    close(m["dual_clip_frac"], 0.5)


def test_gspo_hand_values():
    # seq 0: logp - old = [2e-4, 4e-4] -> s0 = exp(3e-4), inside [1 - 3e-4, 1 + 4e-4]: loss -s0, d/dlogp_t = -s0 / 2
    # seq 1: one token, logp - old = 1e-3 -> s1 = exp(1e-3) > 1 + 4e-4, A > 0: clipped, loss -(1 + 4e-4), grad 0
    cfg = AlgorithmConfig(loss_agg="seq-mean-token-mean")
    loss, g, m = loss_call("gspo", [[2e-4, 4e-4], [1e-3, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 0.0]],
                           [[1, 1], [1, 0]], cfg)
    s0 = math.exp(3e-4)
    close(loss, (-s0 - (1 + 4e-4)) / 2, tol=1e-6)
    close(g, [[-s0 / 2 / 2, -s0 / 2 / 2], [0.0, 0.0]], tol=1e-6)
    close(m["clip_frac"], 0.5)


def test_gspo_ratio_is_token_ratio_for_one_token_responses():
    logp, old, mask = T([[-0.3], [-2.0], [-1.1]]), T([[-0.5], [-1.0], [-1.1]]), torch.ones(3, 1)
    close(sequence_log_ratio(logp, old, mask).exp(), (logp - old).exp()[:, 0])
    # ... so with the same clip range GSPO's loss and gradient are PPO's.
    a = [[1.0], [-2.0], [0.5]]
    wide = {"gspo_clip_low": 0.2, "gspo_clip_high": 0.28}
    g1 = loss_call("gspo", logp, old, a, mask, AlgorithmConfig(params=wide))
    g2 = loss_call("ppo", logp, old, a, mask, AlgorithmConfig(clip_low=0.2, clip_high=0.28))
    close(g1[0], g2[0])
    close(g1[1], g2[1])


def test_gspo_token_matches_gspo_gradient():
    torch.manual_seed(0)
    mask = mask_of([3, 1, 2])
    old = -torch.rand(3, 3)
    logp = old + 1e-4 * torch.randn(3, 3)
    a = T([1.0, -0.5, 2.0])[:, None] * mask  # sequence-level advantages
    cfg = AlgorithmConfig(loss_agg="seq-mean-token-mean")
    l1, g1, _ = loss_call("gspo", logp, old, a, mask, cfg)
    l2, g2, _ = loss_call("gspo_token", logp, old, a, mask, cfg)
    close(l1, l2, tol=1e-6)
    close(g1, g2, tol=1e-6)


def test_sapo_hand_values():
    # r = 1: f = 4/tau * 1/2 = 2/tau, gradient w.r.t. logp = -A f'(1) r = -A (the plain policy gradient).
    # A = +1 uses tau_pos = 1 -> loss -2; A = -1 uses tau_neg = 1.05 -> loss 2/1.05.
    loss, g, _ = loss_call("sapo", [[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]], [[1, 1]])
    close(loss, (-2.0 + 2 / 1.05) / 2)
    close(g, [[-1.0 / 2, 1.0 / 2]])
    # r = e^0.5, A = 2, tau = 1: loss -2 * 4 sigma(r - 1), d/dlogp = -2 * 4 sigma (1 - sigma) * r
    r = math.exp(0.5)
    sig = 1 / (1 + math.exp(-(r - 1)))
    loss, g, _ = loss_call("sapo", [[0.5]], [[0.0]], [[2.0]], [[1]])
    close(loss, -2 * 4 * sig)
    close(g, [[-2 * 4 * sig * (1 - sig) * r]])


def test_sapo_gate_weight_is_one_at_r1_and_decays_smoothly():
    for tau in (1.0, 1.05, 4.0):
        r = torch.linspace(0.2, 3.0, 561, dtype=torch.float64).requires_grad_()
        sapo_gate(r, tau).sum().backward()
        w = r.grad  # f'(r): the gate on the plain importance-weighted gradient r A grad logp
        i1 = int(torch.argmin((r.detach() - 1).abs()))
        close(w[i1], 1.0, tol=1e-9)
        assert (w[1 : i1 + 1] - w[:i1] > 0).all() and (w[i1 + 1 :] - w[i1:-1] < 0).all()  # monotone away from 1
        # No kink: 1 - w(1 +- h) = O(h^2), i.e. zero slope at the peak (a hard clip drops from 1 to 0).
        h = r.detach()[i1 + 1] - 1
        assert (1 - w[i1 + 1]) < h and (1 - w[i1 - 1]) < h
        # and w.r.t. the log-prob, f'(r) r is 1 at r = 1 too
        close(w[i1] * r[i1], 1.0, tol=1e-9)


def test_opd_advantage_and_zero_when_student_equals_teacher():
    close(opd_token_advantage(T([[-1.0, -2.0]]), T([[-1.5, -2.0]]), 0.5), [[-0.25, 0.0]])
    student = T([[-0.7, -1.3, -0.2]])
    mask = torch.ones(1, 3)
    for name in ["grpo", "reinforce_pp_baseline"]:  # task reward off: every reward 0
        a, _ = adv(name, [0.0], [0], [3], AlgorithmConfig(params={"gamma": 0.0}),
                   token_rewards=opd_token_advantage(student, student, 1.0))
        loss, g, _ = loss_call("opd", student, student, a, mask)
        assert loss.item() == 0.0 and torch.equal(g, torch.zeros(1, 3))
    # Otherwise the on-policy gradient is -A / N per token: raises the tokens the teacher prefers.
    a = opd_token_advantage(student, T([[-0.2, -1.3, -1.2]]), 1.0)  # [0.5, 0, -1]
    loss, g, _ = loss_call("opd", student, student, a, mask)
    close(loss, (-0.5 + 1.0) / 3)
    close(g, [[-0.5 / 3, 0.0, 1.0 / 3]])


# ---------------------------------------------------------------- KL, aggregation, correction

def test_kl_estimators_values_and_gradients():
    logp = T([0.0, -1.0], dtype=torch.float32).requires_grad_()
    ref = T([0.0, -1.5])  # d = logp - logq = [0, 0.5]
    close(kl_penalty(logp, ref, "k1"), [0.0, 0.5])
    close(kl_penalty(logp, ref, "k2"), [0.0, 0.125])
    close(kl_penalty(logp, ref, "k3"), [0.0, math.exp(-0.5) + 0.5 - 1])
    for est, grad in [("k1", [1.0, 1.0]), ("k2", [0.0, 0.5]), ("k3", [0.0, 1 - math.exp(-0.5)])]:
        logp.grad = None
        kl_penalty(logp, ref, est).sum().backward()
        close(logp.grad, grad)
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, ref, "k4")


def test_aggregate_hand_values():
    loss = T([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
    mask = T([[1.0, 1, 1], [1, 0, 0]])
    scale = LossScale.of(mask)
    assert scale == LossScale(total_tokens=4, total_seqs=2)
    close(aggregate(loss, mask, "token-mean", scale), 10 / 4)
    close(aggregate(loss, mask, "seq-mean-token-mean", scale), (2 + 4) / 2)
    close(aggregate(loss, mask, "seq-mean-token-sum", scale), (6 + 4) / 2)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "sum", scale)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_sums_over_micro_batches(mode):
    torch.manual_seed(1)
    mask = mask_of([5, 1, 3, 4, 2, 5, 1], 5)
    loss = torch.randn(7, 5)
    scale = LossScale.of(mask)
    full = aggregate(loss, mask, mode, scale)
    parts = sum(aggregate(loss[lo:hi], mask[lo:hi], mode, scale) for lo, hi in [(0, 2), (2, 5), (5, 7)])
    close(parts, full, tol=1e-6)


@pytest.mark.parametrize("name", ["ppo", "gspo", "sapo", "cispo", "reinforce", "dro", "gmpo"])
def test_policy_loss_gradients_accumulate_exactly(name):
    torch.manual_seed(2)
    mask = mask_of([4, 2, 3, 1], 4)
    old = -torch.rand(4, 4)
    logp = (old + 0.2 * torch.randn(4, 4)).requires_grad_()
    a = torch.randn(4, 4) * mask
    cfg = AlgorithmConfig(loss_agg="seq-mean-token-mean")
    scale = LossScale.of(mask)
    fn = get_policy_loss(name)
    full, _ = fn(logp, old, a, mask, cfg, loss_scale=scale)
    (g_full,) = torch.autograd.grad(full, logp)
    parts = sum(fn(logp[s], old[s], a[s], mask[s], cfg, loss_scale=scale)[0] for s in (slice(0, 1), slice(1, 4)))
    (g_parts,) = torch.autograd.grad(parts, logp)
    close(parts, full, tol=1e-6)
    close(g_parts, g_full, tol=1e-6)


def test_tis_truncated_weight():
    old, rollout = T([[0.0, 0.0, 0.0]]), T([[-0.5, -1.0, 0.3]])
    close(tis_weight(old, rollout, 2.0), [[math.exp(0.5), 2.0, math.exp(-0.3)]])  # exp(1) = 2.718 -> capped
    # On-policy PPO (r = 1, A = 1): per-token loss -1, times the weight; the gradient is scaled by it too.
    cfg = AlgorithmConfig(params={"tis": True})
    loss, g, m = loss_call("ppo", old, old, [[1.0, 1.0, 1.0]], [[1, 1, 1]], cfg, rollout=rollout)
    w = [math.exp(0.5), 2.0, math.exp(-0.3)]
    close(loss, -sum(w) / 3)
    close(g, [[-x / 3 for x in w]])
    close(m["tis_capped_frac"], 1 / 3)
    # Off by default, and a no-op without rollout log-probs.
    assert loss_call("ppo", old, old, [[1.0, 1.0, 1.0]], [[1, 1, 1]], rollout=rollout)[0].item() == pytest.approx(-1)
    assert loss_call("ppo", old, old, [[1.0, 1.0, 1.0]], [[1, 1, 1]], cfg)[0].item() == pytest.approx(-1)


# ---------------------------------------------------------------- registry

def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*gae, gpg, grpo, grpo_passk, opo, "
                       "reinforce_pp, reinforce_pp_baseline, remax, rloo"):
        get_advantage("ppo")
    with pytest.raises(ValueError, match="unknown policy loss 'grpo'.*cispo, dro, gmpo, gpg, gspo, gspo_token, m2po, "
                       "opd, ppo, reinforce, sapo"):
        get_policy_loss("grpo")


def test_check_config_rejects_unknown_params():
    check_config(AlgorithmConfig(advantage="gae", policy_loss="sapo", params={"lam": 0.9, "tau_neg": 2.0, "tis": True}))
    with pytest.raises(ValueError, match=r"\['tau_pos'\].*known: \['gamma', 'gspo_clip_high'"):
        check_config(AlgorithmConfig(policy_loss="gspo", params={"tau_pos": 1.0}))
    with pytest.raises(ValueError, match="unknown policy loss"):
        check_config(AlgorithmConfig(policy_loss="nope"))


# The "add your own algorithm" path, exactly as a researcher's module would do it.
CAPPED_PG_PARAMS = {"max_ratio": 5.0}


@register_policy_loss("test_capped_pg", params=CAPPED_PG_PARAMS)
def capped_pg(log_probs, old_log_probs, advantages, mask, cfg, *, loss_scale, rollout_log_probs=None):
    """l_t = -min(r_t, max_ratio) A_t"""
    ratio = log_ratio(log_probs, old_log_probs).exp().clamp(max=read_params(cfg, CAPPED_PG_PARAMS)["max_ratio"])
    loss = -ratio * advantages.detach()
    return reduce_policy_loss(loss, mask, cfg, loss_scale, old_log_probs, rollout_log_probs, {})


def test_registered_loss_is_callable_by_name():
    cfg = AlgorithmConfig(policy_loss="test_capped_pg", params={"max_ratio": 2.0})
    check_config(cfg)
    assert known_policy_losses()["test_capped_pg"] == {"tis": False, "tis_cap": 2.0, "max_ratio": 5.0}
    # r = [3, 1] -> [2 (capped), 1], A = 1: loss -(2 + 1) / 2, gradient [0, -1/2]
    loss, g, _ = loss_call("test_capped_pg", [[math.log(3.0), 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[1, 1]], cfg)
    close(loss, -1.5)
    close(g, [[0.0, -0.5]])
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("ppo")(capped_pg)
