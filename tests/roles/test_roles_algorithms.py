"""The algorithm roles: Critic (value model, clipped value loss), Teacher (on-policy distillation), DAPO
dynamic sampling marks, and which services a config starts. Fast (no Ray); the e2e runs are in
tests/roles/test_roles_algorithms_e2e.py."""

from pathlib import Path

import pytest
import torch

from relax.algorithms import AdvantageInput, check_config, filter_groups, get_advantage
from relax.algorithms.groups import sample_informative_groups
from relax.config import ModelConfig, load_config
from relax.schedules import role_names
from relax.models import build_model
from relax.roles.actor import dynamic_sampling_metrics
from relax.roles.critic import Critic, clipped_value_loss
from relax.roles.teacher import opd_inputs, teacher_config
from relax.trainers import pad_right

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _cfg(*overrides):
    return load_config(ROOT / "experiments/async/cpu.yaml", list(overrides))


# --- Critic -------------------------------------------------------------------------------------------------
def test_clipped_value_loss_hand_computed():
    v = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    # token 0: unclipped (1-2)^2 = 1, clipped (0.2-2)^2 = 3.24 -> max 3.24, x0.5 = 1.62; token 1 masked out
    loss, m = clipped_value_loss(v, old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx(1.62)
    assert m["value_clip_frac"] == 1.0
    # inside the clip range the loss is the plain squared error
    loss, _ = clipped_value_loss(torch.tensor([[0.1]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]),
                                 torch.ones(1, 1), clip=0.2)
    assert loss.item() == pytest.approx(0.5 * 0.81)


def test_critic_value_loss_decreases_on_a_fixed_batch():
    lm, tok = build_model(TINY, seed=0)
    critic = Critic(lm, tok.pad_token_id, lr=3e-3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 20, (n,), generator=g) for n in (5, 7, 4, 6)]
    responses = [torch.randint(3, 20, (n,), generator=g) for n in (3, 4, 2, 5)]
    returns = [torch.full((len(r),), float(i % 2)) for i, r in enumerate(responses)]
    assert all(v.abs().max() == 0 for v in critic.values(prompts, responses))  # zero-initialised head
    losses = []
    for _ in range(30):
        old = critic.values(prompts, responses)  # the role's V_old: what it wrote before the update
        losses.append(critic.train_batch(prompts, responses, old, returns)["value_loss"])
    assert losses[-1] < 0.3 * losses[0], losses
    final = critic.values(prompts, responses)
    assert final[1].mean() > final[0].mean()  # learnt which responses return 1


# --- Teacher / OPD ------------------------------------------------------------------------------------------
def _opd_batch(student, teacher, rewards):
    return {"rollout_log_probs": [torch.tensor(s) for s in student],
            "teacher_log_probs": [torch.tensor(t) for t in teacher],
            "rewards": torch.tensor(rewards), "group_id": torch.tensor([0, 0]),
            "response_ids": [torch.zeros(len(s), dtype=torch.long) for s in student]}


def _opd_advantages(cfg, batch):
    mask = pad_right([r.new_ones(len(r)).float() for r in batch["response_ids"]], dtype=None)
    rewards, token_rewards, alg = opd_inputs(batch, cfg, mask)
    check_config(alg)
    inp = AdvantageInput(rewards=rewards, group_index=batch["group_id"], response_mask=mask, token_rewards=token_rewards)
    return get_advantage(alg.advantage)(inp, alg)[0], mask


def test_opd_advantage_is_zero_when_teacher_equals_student():
    cfg = _cfg("algorithm.policy_loss=opd", "algorithm.params={task_reward: false}")
    lp = [[-0.5, -1.0, -2.0], [-0.1, -3.0]]
    adv, _ = _opd_advantages(cfg, _opd_batch(lp, lp, [1.0, 0.0]))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_opd_advantage_is_the_per_token_reverse_kl():
    cfg = _cfg("algorithm.policy_loss=opd", "algorithm.params={task_reward: false, opd_coef: 0.5}")
    adv, mask = _opd_advantages(cfg, _opd_batch([[-1.0, -2.0], [-0.5]], [[-0.5, -3.0], [-0.5]], [1.0, 0.0]))
    # -0.5 * (student - teacher) per token, gamma 0 (no reward-to-go), task reward off
    assert torch.allclose(adv, torch.tensor([[0.25, -0.5], [0.0, 0.0]]))
    # with the task reward on, the GRPO term of the group (+-0.7071) is added to every token
    cfg = _cfg("algorithm.policy_loss=opd", "algorithm.params={opd_coef: 0.5}")
    adv, _ = _opd_advantages(cfg, _opd_batch([[-1.0, -2.0], [-0.5]], [[-0.5, -3.0], [-0.5]], [1.0, 0.0]))
    s = 1 / 2**0.5
    assert torch.allclose(adv, torch.tensor([[s + 0.25, s - 0.5], [-s, 0.0]]), atol=1e-5)


def test_teacher_is_the_warmup_trained_longer():
    cfg = _cfg("algorithm.policy_loss=opd")
    assert teacher_config(cfg).warmup.steps == 3 * cfg.warmup.steps
    assert teacher_config(cfg).model == cfg.model
    cfg = _cfg("algorithm.policy_loss=opd", "teacher.warmup_steps=50")
    assert teacher_config(cfg).warmup.steps == 50
    bad = _cfg("algorithm.policy_loss=opd", "teacher.model={kind: smollm2, tokenizer: hf}")
    with pytest.raises(ValueError, match="tokenizer"):
        teacher_config(bad)


# --- DAPO marks ----------------------------------------------------------------------------------------------
def test_dynamic_sampling_marks_degenerate_groups():
    keep = filter_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert keep.tolist() == [False, False, True, True, False, False]


def _fake_sampler(informative_prompts, calls):
    """generate: output = (prompt, j); score: varies within the group only for prompts in the set."""
    def generate(prompts):
        calls.append(list(prompts))
        return [(p, j) for j, p in enumerate(prompts)]

    def score(p, out):
        return float(out[1] % 2) if p in informative_prompts else 1.0
    return generate, score


def test_dynamic_sampling_redraws_degenerate_slots_until_full():
    calls = []
    generate, score = _fake_sampler({10, 21, 22}, calls)
    # slot s at attempt a gets prompt 10 * (a + 1) + s: slot 0 is informative at once, slots 1 and 2 at attempt 1
    drawn = sample_informative_groups([0, 1, 2], lambda s, a: 10 * (a + 1) + s, generate, score,
                                      group_size=2, max_batches=3)
    assert [(drawn[s].prompt, drawn[s].attempts, drawn[s].informative) for s in range(3)] == \
        [(10, 1, True), (21, 2, True), (22, 2, True)]
    assert calls == [[10, 10, 11, 11, 12, 12], [21, 21, 22, 22]]  # one batched generate per round, redraws only
    assert drawn[1].rewards == [0.0, 1.0] and drawn[1].outputs == [(21, 0), (21, 1)]


def test_dynamic_sampling_stops_at_the_cap():
    calls = []
    generate, score = _fake_sampler({10}, calls)
    drawn = sample_informative_groups([0, 1], lambda s, a: 10 * (a + 1) + s, generate, score,
                                      group_size=2, max_batches=3)
    assert len(calls) == 3  # slot 1 never becomes informative: drawn max_batches times, then kept as is
    assert (drawn[1].prompt, drawn[1].attempts, drawn[1].informative) == (31, 3, False)
    assert (drawn[0].attempts, drawn[0].informative) == (1, True)
    one = sample_informative_groups([0, 1], lambda s, a: 10 * (a + 1) + s, generate, score, 2, max_batches=1)
    assert [one[s].attempts for s in (0, 1)] == [1, 1] and len(calls) == 4  # cap 1: no redraw
    with pytest.raises(ValueError):
        sample_informative_groups([0], lambda s, a: 0, generate, score, 2, max_batches=0)


def test_dynamic_sampling_metrics():
    # 2 groups of 4: one drawn twice, one drawn 3 times and still dropped (4 rows)
    assert dynamic_sampling_metrics(4, [2] * 4 + [3] * 4 + [1] * 8, 4) == \
        {"samples_dropped": 4, "groups_dropped": 1, "groups_resampled": 2, "groups_generated": 7}


# --- which services run ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, extra, absent", [
    ([], set(), {"critic", "teacher", "genrm"}),
    (["algorithm.advantage=gae"], {"critic"}, {"teacher"}),
    (["algorithm.policy_loss=opd"], {"teacher"}, {"critic"}),
    (["task.reward=genrm"], {"genrm"}, {"reward"}),
])
def test_role_names(tmp_path, overrides, extra, absent):
    names = role_names(_cfg(*overrides))
    assert extra <= set(names) and not absent & set(names)
    assert names[0] == "rollout" and names[-2:] == ["advantages", "actor"]  # optional services precede Advantages


def test_new_config_sections_validate():
    cfg = _cfg("algorithm.dynamic_sampling.enabled=true", "genrm.timeout_s=2", "task.reward=multiple_choice")
    assert cfg.algorithm.dynamic_sampling.enabled and cfg.genrm.timeout_s == 2
    assert cfg.resources.critic.cpus == cfg.resources.teacher.cpus == cfg.resources.genrm.cpus == 0.25
    assert check_config(_cfg("algorithm.policy_loss=opd", "algorithm.params={opd_coef: 2.0, task_reward: false}").algorithm) is None


# --- the README's worked example ---------------------------------------------------------------------------------
def test_capped_pg_example_registers_and_has_the_documented_gradient():
    from relax.algorithms import LossScale, known_policy_losses
    from relax.algorithms.capped_pg import capped_pg_loss

    assert known_policy_losses()["capped_pg"]["cap"] == 2.0
    cfg = _cfg("algorithm.policy_loss=capped_pg", "algorithm.params={cap: 1.5}", "algorithm.loss_agg=seq-mean-token-sum")
    check_config(cfg.algorithm)
    logp = torch.tensor([[-1.0, -0.2]], requires_grad=True)
    old = torch.tensor([[-2.0, -0.2]])  # ratios e^1 = 2.718 (capped at 1.5) and 1
    adv = torch.tensor([[2.0, 2.0]])
    loss, m = capped_pg_loss(logp, old, adv, torch.ones(1, 2), cfg.algorithm, loss_scale=LossScale(total_tokens=2, total_seqs=1))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.5 * 2.0, -1.0 * 2.0]]))
    assert m["capped_frac"] == 0.5


# --- KL as a reward penalty ----------------------------------------------------------------------------------
def test_kl_in_reward_advantages_add_the_token_penalty():
    from relax.roles.advantages import AdvantagesRole

    class _Weights:  # the DCS handle: Advantages only registers
        def join(self, *args, **kwargs):
            pass

    cfg = _cfg("algorithm.kl_in_reward=true", "algorithm.kl_coef=0.5", "algorithm.kl_estimator=k1",
               "algorithm.advantage=reinforce_pp")
    role = AdvantagesRole.__ray_actor_class__(cfg, None, None, _Weights(), 1)
    assert {"rollout_log_probs", "ref_log_probs"} <= set(role.fields)
    T = torch.tensor
    batch = {"rewards": T([1.0, 0.0]), "group_id": T([0, 0]), "response_ids": [T([5, 6]), T([7])],
             "rollout_log_probs": [T([-1.0, -1.0]), T([-2.0])], "ref_log_probs": [T([-1.2, -1.0]), T([-1.0])]}
    # k1 = [.2, 0], [-1] -> token rewards -0.5 k1 = [-.1, 0], [.5]; with R on the last token the reward-to-go
    # is G = [.9, 1], [.5]: mean .8, unbiased std sqrt(.07), whitened by reinforce_pp
    out = role.compute(batch)["advantages"]
    s = 0.07 ** 0.5 + 1e-6
    assert torch.allclose(out[0], T([0.1 / s, 0.2 / s]), atol=1e-5)
    assert torch.allclose(out[1], T([-0.3 / s]), atol=1e-5)
    plain = AdvantagesRole.__ray_actor_class__(_cfg("algorithm.advantage=reinforce_pp"), None, None, _Weights(), 1)
    assert "ref_log_probs" not in plain.fields
