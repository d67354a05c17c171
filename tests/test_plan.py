"""`relax run CONFIG --dry-run`: the h800x16 experiments resolve into a complete cluster plan without a GPU."""

import json

from relax.cli import main
from relax.config import load_config
from relax.plan import resolve_plan


def test_async_plan_has_every_role_pool_and_launch_command():
    plan = resolve_plan(load_config("experiments/async/h800x16.yaml"))
    assert plan["problems"] == []
    assert plan["cluster"]["gpus"] == 16 and plan["cluster"]["nodes"] == 2
    roles = {r["role"]: r for r in plan["roles"]}
    assert set(roles) == {"rollout", "reward", "reference", "advantages", "actor", "actor_fwd"}
    assert roles["actor"]["backend"] == "megatron" and roles["rollout"]["backend"] == "sglang"
    assert roles["reward"]["gpus"] == 0 and roles["reward"]["placement_group"] is None
    pgs = {pg["name"]: pg for pg in plan["placement_groups"]}
    assert sum(sum(b["GPU"] for b in pg["bundles"]) for pg in pgs.values()) == 16  # separate pools in async mode
    assert len(pgs["actor_pg"]["bundles"]) == 8 and len(pgs["rollout_pg"]["bundles"]) == 4
    actor = plan["megatron"]["actor"]
    assert (actor["tp"], actor["pp"], actor["cp"], actor["ep"], actor["dp"]) == (2, 1, 1, 1, 4)
    assert actor["sequence_parallel"] and not actor["forward_only"] and plan["megatron"]["reference"]["forward_only"]
    assert "WORLD_SIZE=8" in actor["launch"] and "actor_pg" in actor["launch"]
    assert "rank 0 is the actor role's process" in actor["launch"] and not any(
        n.startswith("actor:") for n in plan["notes"])  # the Actor's 8-rank group is started (MegatronGroup)
    cmds = plan["rollout"]["commands"]
    assert len(cmds) == 4 and len({c["port"] for c in cmds}) == 4
    assert all("sglang.launch_server" in c["command"] and "--model-path /models/Qwen3-4B" in c["command"]
               for c in cmds)
    assert "NCCL" in plan["rollout"]["weight_sync"]


def test_colocate_plan_shares_one_placement_group():
    plan = resolve_plan(load_config("experiments/colocate/h800x16.yaml"))
    assert plan["problems"] == [] and plan["cluster"]["gpus"] == 16
    (pg,) = plan["placement_groups"]
    assert len(pg["bundles"]) == 16 and set(pg["shared_by"]) == {"actor", "rollout", "reference"}
    shares = [r["gpu_fraction_per_bundle"] for r in plan["roles"] if r["gpus"] > 0]
    assert len(set(shares)) == 1 and 0.999 < sum(shares) <= 1.0  # equal shares of each GPU (Ray's 1e-4 steps)
    assert len(plan["rollout"]["commands"]) == 16
    assert all("--enable-memory-saver" in c["command"] for c in plan["rollout"]["commands"])
    assert plan["megatron"]["actor"]["dp"] == 8


def test_moe_plan_uses_the_configured_expert_parallelism_and_routed_experts():
    """r3_moe/h800x16: Relax's 30B-A3B async layout (actor TP 4 x PP 2, EP 4; reference/actor_fwd TP 2, EP 2)."""
    plan = resolve_plan(load_config("experiments/r3_moe/h800x16.yaml"))
    assert plan["problems"] == [] and plan["model"]["moe"]
    a, r = plan["megatron"]["actor"], plan["megatron"]["reference"]
    assert (a["tp"], a["pp"], a["cp"], a["ep"], a["etp"], a["dp"], a["expert_dp"]) == (4, 2, 1, 4, 1, 1, 1)
    assert a["sequence_parallel"] and a["source"] == "training.parallel"
    assert (r["tp"], r["pp"], r["ep"], r["dp"], r["sequence_parallel"]) == (2, 1, 2, 1, False)
    assert r["source"] == plan["megatron"]["actor_fwd"]["source"] == "training.forward_parallel"
    (cmd,) = plan["rollout"]["commands"]
    assert "--tp-size 4" in cmd["command"] and "--enable-return-routed-experts" in cmd["command"]


def test_a_dense_layout_on_a_moe_model_is_valid_and_expert_parallel_on_a_dense_model_is_not():
    plan = resolve_plan(load_config("experiments/async/h800x16.yaml", ["model.path=/models/Qwen3-30B-A3B"]))
    assert plan["problems"] == [] and plan["model"]["moe"] and plan["megatron"]["actor"]["ep"] == 1
    plan = resolve_plan(load_config("experiments/async/h800x16.yaml", ["training.parallel.expert=2"]))
    assert any("expert > 1 needs a MoE model" in p for p in plan["problems"])


def test_model_shapes_the_config_cannot_see_are_checked_by_the_plan():
    # Qwen3-30B-A3B has 4 KV heads: TP 8 fits the 8 actor GPUs but not the attention.
    cfg = load_config("experiments/r3_moe/h800x16.yaml", ["training.parallel.tensor=8", "training.parallel.pipeline=1",
                                                          "training.parallel.expert=8"])
    plan = resolve_plan(cfg)
    assert any(p.startswith("actor:") and "num_kv_heads=4" in p for p in plan["problems"]), plan["problems"]


def test_a_layout_that_does_not_fit_the_model_is_reported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=128, vocab_size=98, tie_word_embeddings=True)))
    cfg = load_config("experiments/async/h800x16.yaml", [f"model.path={tmp_path}"])
    plan = resolve_plan(cfg, parallel={"tp": 4})
    assert any("num_kv_heads=2 is not divisible by tp=4" in p for p in plan["problems"])
    assert plan["model"]["config_source"].endswith("config.json")


def test_cpu_config_plans_torch_backends():
    plan = resolve_plan(load_config("experiments/async/cpu.yaml"))
    assert {r["backend"] for r in plan["roles"] if r["role"] in ("actor", "rollout")} == {"torch"}
    assert plan["placement_groups"] == [] and plan["rollout"]["commands"] == [] and plan["cluster"]["gpus"] == 0


def test_cli_dry_run_prints_table_and_json(capsys):
    assert main(["run", "experiments/async/h800x16.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "megatron role" in out and "sglang.launch_server" in out and "ray start --head" in out
    assert main(["run", "experiments/colocate/h800x16.yaml", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mode"] == "colocate" and plan["cluster"]["nodes"] == 2


def test_every_h800x16_experiment_resolves_into_a_complete_plan():
    import glob

    files = sorted(glob.glob("experiments/*/h800x16.yaml"))
    assert len(files) == 4, files
    for f in files:
        plan = resolve_plan(load_config(f))
        assert plan["problems"] == [], (f, plan["problems"])
        assert plan["cluster"]["gpus"] == 16 and plan["cluster"]["nodes"] == 2, f
        gpu_roles = [r for r in plan["roles"] if r["gpus"] > 0]
        assert {r["role"] for r in gpu_roles} >= {"actor", "rollout"}, f
        assert all(r["placement_group"] for r in gpu_roles), f
        for r in gpu_roles:
            if r["role"] != "rollout":
                lay = plan["megatron"][r["role"]]
                assert r["backend"] == "megatron" and lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == r["gpus"], (f, lay)
                assert lay["launch"], f
        assert plan["rollout"]["backend"] == "sglang" and plan["rollout"]["commands"], f
        assert sum(c["gpus"] for c in plan["rollout"]["commands"]) == plan["rollout"]["replicas"] * \
            plan["rollout"]["gpus_per_engine"]


def test_cpu_ranks_of_a_megatron_actor_and_reference_are_planned_as_emulation():
    plan = resolve_plan(load_config("experiments/async/cpu.yaml", [
        "training.trainer=megatron", "resources.actor.workers=4", "training.parallel.tensor=2",
        "resources.reference.workers=2"]))
    roles = {r["role"]: r for r in plan["roles"]}
    assert (roles["actor"]["backend"], roles["actor"]["workers"]) == ("megatron", 4)
    assert (roles["reference"]["backend"], roles["reference"]["workers"]) == ("megatron", 2)
    assert (plan["megatron"]["actor"]["tp"], plan["megatron"]["actor"]["dp"]) == (2, 2) and plan["problems"] == []
    assert any(n.startswith("actor: 4 CPU rank(s)") and "emulated" in n for n in plan["notes"])
    assert resolve_plan(load_config("experiments/async/cpu.yaml"))["megatron"] == {}  # torch trainer
