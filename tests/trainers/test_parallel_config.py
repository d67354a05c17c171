"""training.parallel / training.forward_parallel: Megatron layouts are validated against each role's GPUs and the
model's shapes when the config loads, with the offending field named."""

import pytest

from relax.config import ConfigError, load_config, megatron_roles, role_parallel

R3 = "experiments/r3_moe/h800x16.yaml"
ASYNC = "experiments/async/h800x16.yaml"


def _err(path, *overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    return str(e.value)


def test_paper_layouts_load_and_forward_roles_take_forward_parallel():
    cfg = load_config(R3)
    assert megatron_roles(cfg) == ["actor", "reference", "actor_fwd"]
    a, r = role_parallel(cfg, "actor"), role_parallel(cfg, "reference")
    assert (a.tensor, a.pipeline, a.expert, a.etp, a.sequence_parallel) == (4, 2, 4, 1, True)
    assert (r.tensor, r.pipeline, r.expert, r.sequence_parallel) == (2, 1, 2, False)
    cfg = load_config(ASYNC)
    assert role_parallel(cfg, "reference") is cfg.training.parallel  # forward_parallel unset
    assert megatron_roles(load_config("experiments/async/cpu.yaml")) == []  # torch trainer


def test_parallelism_needs_the_megatron_trainer():
    assert "training.parallel: model parallelism needs training.trainer 'megatron'" in _err(
        "experiments/async/cpu.yaml", "training.parallel.tensor=2")


def test_sizes_must_divide_each_roles_gpus():
    msg = _err(ASYNC, "training.parallel.tensor=3")
    assert "training.parallel (actor, 8 GPU(s))" in msg and "does not divide the role's 8 GPU(s)" in msg
    msg = _err(R3, "training.forward_parallel.tensor=4")  # reference has 2 GPUs
    assert "training.forward_parallel (reference, 2 GPU(s))" in msg
    msg = _err(R3, "training.parallel.expert=8")  # EP 8 x expert TP 1 x PP 2 = 16 > 8 actor GPUs
    assert "expert x expert_tensor x pipeline = 8 x 1 x 2 does not divide the role's 8 GPU(s)" in msg
    assert "whole GPUs" in _err(ASYNC, "resources.actor.gpus=7.5")


def test_sequence_parallel_context_parallel_and_expert_tensor_rules():
    assert "sequence_parallel needs tensor > 1" in _err(ASYNC, "training.parallel.tensor=1")
    assert "loss_agg 'token-mean'" in _err(ASYNC, "training.parallel.context=2", "algorithm.loss_agg=seq-mean-token-mean",
                                          "training.forward_parallel={tensor: 2, sequence_parallel: true}")
    assert "expert_tensor must be 1 or tensor" in _err(R3, "training.parallel.expert_tensor=2", "training.parallel.expert=2")


def test_model_shapes_known_to_the_config_are_checked():
    tiny = ["model.kind=tiny_qwen3_moe", "model.tokenizer=char", "model.num_experts=6", "model.num_heads=4",
            "model.num_kv_heads=2", "model.num_layers=2", "model.experts_per_token=2"]
    assert "expert=4 does not divide num_experts=6" in _err(R3, *tiny)
    assert "tensor=4 does not divide num_kv_heads=2" in _err(R3, *tiny, "model.num_experts=8")
    assert "expert > 1 needs a MoE model" in _err(R3, *tiny[1:], "model.kind=tiny_qwen3")
    load_config(R3, [*tiny, "model.num_experts=8", "model.num_kv_heads=4", "model.num_heads=8"])  # fits


def test_actor_workers_set_the_megatron_world_size_on_cpu():
    from relax.config import role_world_size

    cpu = "experiments/async/cpu.yaml"
    cfg = load_config(cpu, ["training.trainer=megatron", "resources.actor.workers=2", "training.parallel.tensor=2"])
    assert role_world_size(cfg, "actor") == 2 and role_world_size(load_config(ASYNC), "actor") == 8
    assert "training.parallel (actor, 2 CPU rank(s))" in _err(cpu, "training.trainer=megatron", "resources.actor.workers=2",
                                                            "training.parallel.tensor=4")
    assert "resources.actor.workers: the actor runs no Megatron (needs training.trainer 'megatron')" in _err(
        cpu, "resources.actor.workers=2")
    assert "only the actor and reference run a Megatron worker group" in _err(cpu, "training.trainer=megatron",
                                                                              "resources.critic.workers=2")
    assert "needs training.trainer 'megatron' and algorithm.kl_coef > 0" in _err(
        cpu, "training.trainer=megatron", "resources.reference.workers=2", "algorithm.kl_coef=0")
    # the reference's Megatron forward takes training.forward_parallel (or the actor's layout) on its own ranks
    load_config(cpu, ["training.trainer=megatron", "resources.reference.workers=2", "training.forward_parallel.tensor=2"])
    assert "training.parallel (reference, 1 CPU rank(s))" in _err(
        cpu, "training.trainer=megatron", "resources.actor.workers=2", "training.parallel.tensor=2",
        "resources.reference.workers=1")
    assert "one rank per GPU" in _err(ASYNC, "resources.actor.workers=4")
