"""Rollout Routing Replay (R3, relax/moe/): capture in the rollout engine, the bus fields, replay in the trainer.

A tiny Qwen3-MoE (8 experts, top-2, 2 layers, hidden 64) with weights drawn at std 1/sqrt(fan_in), so the
router's choices matter and a bf16 engine routes some tokens differently from the fp32 trainer.
"""

from __future__ import annotations

import copy

import pytest
import torch

from relax.config import ConfigError, ExperimentConfig, ModelConfig, TrainingConfig, validate
from relax.engines import TorchEngine
from relax.models import build_model, state_dict_cpu
from relax.moe import (NOT_ROUTED, ROUTED_FIELD, RoutingCapture, build_replay, moe_routers, r3_fields,
                       replay_from_batch, replay_routing, routing_fields)
from relax.moe.fields import bytes_per_sample
from relax.trainers import TorchTrainer, compute_log_probs, pack

MC = ModelConfig(kind="tiny_qwen3_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=128, num_experts=8, experts_per_token=2)
K, E = 2, 8


def _model(state=None):
    model, tok = build_model(MC, 0)
    if state is None:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0, p.shape[-1] ** -0.5, generator=g)
    else:
        model.load_state_dict(state)
    return model, tok


@pytest.fixture(scope="module")
def moe():
    torch.set_num_threads(1)
    model, tok = _model()
    return model, tok, state_dict_cpu(model)


def _generate(state, tok, dtype, n_rows=32, max_new=8, seed=1):
    engine = TorchEngine(_model(state)[0], tok, dtype=dtype, seed=seed, record_routing=True)
    prompts = [tok.encode(f"{a} + {b} = Answer:") for a in range(8) for b in range(n_rows // 8)]
    gens = engine.generate(prompts, max_new)
    responses = [torch.tensor(g.token_ids) for g in gens]
    fields = routing_fields([g.extras["routed_experts"] for g in gens], [len(p) for p in prompts],
                            [len(r) for r in responses], E)
    rows = {"prompt_ids": [torch.tensor(p) for p in prompts], "response_ids": responses,
            "rollout_log_probs": [torch.tensor(g.log_probs) for g in gens], **fields}
    return rows, gens


@pytest.fixture(scope="module")
def bf16_rollout(moe):
    _, tok, state = moe
    return _generate(state, tok, "bfloat16")


def _own_routes(model, rows, routing=None):
    """The experts each router selects in one packed forward: [B, width, layers, k]."""
    packed = pack(rows["prompt_ids"], rows["response_ids"], 0)
    B, W = packed.input_ids.shape
    seen = []
    handles = [r.register_forward_hook(lambda m, a, out: seen.append(out[2].detach().clone()))
               for r in moe_routers(model)]
    try:
        data = {**rows, **(routing or {})}
        with torch.no_grad(), replay_from_batch(model, data if routing else {}, W):
            model(input_ids=packed.input_ids, attention_mask=packed.attention_mask)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(seen, dim=1).view(B, W, len(seen), -1)


def _sets(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.long).sort(dim=-1).values


def test_capture_layout_matches_the_models_own_routing(moe):
    """fp32 engine: prompt + fed response tokens, uint8, aligned with what the same model routes in one pass."""
    model, tok, state = moe
    rows, gens = _generate(state, tok, "float32", n_rows=16)
    own = _own_routes(model, rows)
    agree = total = 0
    for i, g in enumerate(gens):
        rec = g.extras["routed_experts"]
        p, m = len(rows["prompt_ids"][i]), len(g.token_ids)
        assert rec.dtype == torch.uint8 and rec.shape == (p + m - 1, MC.num_layers, K)
        same = (_sets(rec) == _sets(own[i, : p + m - 1])).all(-1)
        agree += int(same.sum())
        total += same.numel()
        # The bus field: one entry per prompt + response token; the last token was never fed to the engine.
        field = rows[ROUTED_FIELD][i]
        assert field.shape == (p + m, MC.num_layers, K) and field.dtype == torch.uint8
        assert (field[-1] == NOT_ROUTED[torch.uint8]).all() and torch.equal(field[:-1], rec)
    # KV-cache decoding in fp32 may flip a near-tie now and then; a misaligned record would agree ~25%.
    assert agree / total > 0.98, f"{agree}/{total}"


def test_replay_reproduces_the_recorded_expert_sets_exactly(moe, bf16_rollout):
    model, _, _ = moe
    rows, _ = bf16_rollout
    own = _own_routes(model, rows)
    replayed = _own_routes(model, rows, {ROUTED_FIELD: rows[ROUTED_FIELD]})
    differs = 0
    for i in range(len(rows["response_ids"])):
        p, m = len(rows["prompt_ids"][i]), len(rows["response_ids"][i])
        rec = rows[ROUTED_FIELD][i][:-1].to(torch.long)
        assert torch.equal(replayed[i, : p + m - 1], rec)  # the recorded experts, in the recorded order
        # The last response token (never fed to the engine) and the padding keep the trainer's own routing;
        # in layer 0 its input does not depend on earlier routing, so it is exactly the unpatched choice.
        assert torch.equal(replayed[i, p + m - 1 :, 0], own[i, p + m - 1 :, 0])
        differs += int((_sets(rec) != _sets(own[i, : p + m - 1])).any(-1).sum())
    assert differs > 0, "the bf16 engine routed every token as the fp32 trainer does: nothing to replay"


def test_unrecorded_tokens_route_exactly_as_without_replay(moe):
    model, tok, _ = moe
    ids = torch.tensor([tok.encode("3 + 4 = Answer: 7")])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        with replay_routing(model, torch.zeros((1, ids.shape[1], MC.num_layers, K), dtype=torch.long),
                            torch.zeros((1, ids.shape[1]), dtype=torch.bool)):
            out = model(input_ids=ids).logits
    assert torch.equal(ref, out)
    assert all("forward" not in r.__dict__ for r in moe_routers(model))  # the patch is gone


def test_gate_weights_are_the_router_softmax_over_the_recorded_set_and_train_the_router(moe):
    model, _, _ = moe
    router = moe_routers(model)[0]
    torch.manual_seed(0)
    hs = torch.randn(5, MC.hidden_size)
    experts = torch.tensor([[7, 0], [1, 2], [3, 5], [6, 4], [0, 1]])
    mask = torch.tensor([True, True, True, True, False])
    with replay_routing(model, experts.view(1, 5, 1, K).expand(1, 5, MC.num_layers, K),
                        mask.view(1, 5)):
        logits, gates, idx = router(hs)
    s = hs @ router.weight.T
    for t in range(4):
        assert idx[t].tolist() == experts[t].tolist()
        e = s[t, experts[t]].exp()
        torch.testing.assert_close(gates[t], e / e.sum())  # g_i = I_i exp(s_i) / sum_j I_j exp(s_j)
    top = torch.softmax(s[4], -1).topk(K)
    assert idx[4].tolist() == top.indices.tolist()  # unrecorded: the router's own choice
    # Gradients reach the router through the replayed gates.
    (gates[:4] * torch.arange(K)).sum().backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    router.weight.grad = None


def test_training_step_under_replay_updates_every_router(moe, bf16_rollout):
    model, tok, state = moe
    rows, _ = bf16_rollout
    cfg = ExperimentConfig(name="t", model=MC, training=TrainingConfig(micro_batch_tokens=4096))
    trainer = TorchTrainer(_model(state)[0], tok.pad_token_id, cfg)
    mb = {**rows, "old_log_probs": rows["rollout_log_probs"],
          "advantages": [torch.full((len(r),), 1.0 if i % 2 else -1.0) for i, r in enumerate(rows["response_ids"])]}
    metrics = trainer.accumulate(mb, __import__("relax.algorithms", fromlist=["LossScale"]).LossScale(1, 1))
    assert metrics["logp_gap_abs"] > 0 and metrics["logp_gap_kl"] >= 0
    for r in moe_routers(trainer.model):
        assert r.weight.grad is not None and torch.isfinite(r.weight.grad).all() and r.weight.grad.abs().sum() > 0


def test_r3_brings_the_trainers_log_probs_closer_to_the_bf16_engine(moe, bf16_rollout):
    model, tok, _ = moe
    rows, _ = bf16_rollout
    engine_lp = torch.cat(rows["rollout_log_probs"])

    def gap(routing):
        lp = compute_log_probs(model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], 1.0, 4096, routing)
        return (torch.cat(lp) - engine_lp).abs().mean().item()

    off = gap(None)
    response_only = gap({ROUTED_FIELD: [r[len(p):] for p, r in zip(rows["prompt_ids"], rows[ROUTED_FIELD])]})
    full = gap({ROUTED_FIELD: rows[ROUTED_FIELD]})
    assert response_only < off and full < 0.7 * off, (off, response_only, full)


def test_bf16_trainer_keeps_fp32_master_weights_and_r3_brings_it_closer_to_the_bf16_engine(moe, bf16_rollout):
    """training.precision bf16 (the setting the paper measures: a bf16 trainer against a bf16 engine): the
    forwards' matmuls run in bf16 under autocast, weights, gradients and log-probs stay fp32; with R3 the
    trainer's log-probs on the engine's tokens are closer to the engine's than without, and the replayed
    training forward still trains every router."""
    from relax.algorithms import LossScale

    model, tok, state = moe
    rows, _ = bf16_rollout
    with pytest.raises(ConfigError, match="precision"):
        validate({"name": "x", "training": {"precision": "fp16"}})
    cfg = ExperimentConfig(name="t", model=MC, training=TrainingConfig(micro_batch_tokens=4096, precision="bf16"))
    trainer = TorchTrainer(_model(state)[0], tok.pad_token_id, cfg)
    engine_lp = torch.cat(rows["rollout_log_probs"])
    off = trainer.log_probs(rows["prompt_ids"], rows["response_ids"], 4096)
    on = trainer.log_probs(rows["prompt_ids"], rows["response_ids"], 4096, {ROUTED_FIELD: rows[ROUTED_FIELD]})
    fp32 = compute_log_probs(model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], 1.0, 4096)
    assert all(x.dtype == torch.float32 for x in off)
    assert not torch.equal(torch.cat(off), torch.cat(fp32))  # the forward did run in bf16
    gap_off = (torch.cat(off) - engine_lp).abs().mean().item()
    gap_on = (torch.cat(on) - engine_lp).abs().mean().item()
    assert gap_on < 0.7 * gap_off, (gap_off, gap_on)
    mb = {**rows, "old_log_probs": rows["rollout_log_probs"],
          "advantages": [torch.full((len(r),), 1.0 if i % 2 else -1.0) for i, r in enumerate(rows["response_ids"])]}
    trainer.accumulate(mb, LossScale(1, 1))
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    for r in moe_routers(trainer.model):
        g = r.weight.grad
        assert g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() and g.abs().sum() > 0
    trainer.step()


def test_top8_of_64_experts_replay_is_exact_at_every_recorded_position():
    """The shape closest to Qwen3-30B-A3B's routing in the study (top-8 of 64 experts, more layers): uint8
    records of the bf16 engine are replayed exactly at every prompt and response position, in every layer."""
    mc = ModelConfig(kind="tiny_qwen3_moe", hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                     intermediate_size=32, num_experts=64, experts_per_token=8)
    model, tok = build_model(mc, 0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, p.shape[-1] ** -0.5, generator=g)
    engine = TorchEngine(copy.deepcopy(model), tok, dtype="bfloat16", seed=1, record_routing=True)
    prompts = [tok.encode(f"{a} + {b} = Answer:") for a in range(4) for b in range(3)]
    gens = engine.generate(prompts, 6)
    responses = [torch.tensor(x.token_ids) for x in gens]
    fields = routing_fields([x.extras["routed_experts"] for x in gens], [len(p) for p in prompts],
                            [len(r) for r in responses], 64)
    rows = {"prompt_ids": [torch.tensor(p) for p in prompts], "response_ids": responses, **fields}
    assert all(r.dtype == torch.uint8 and r.shape[1:] == (3, 8) for r in fields[ROUTED_FIELD])
    own = _own_routes(model, rows)
    replayed = _own_routes(model, rows, fields)
    differs = 0
    for i, rec in enumerate(fields[ROUTED_FIELD]):
        T = rec.shape[0] - 1
        assert torch.equal(replayed[i, :T], rec[:T].to(torch.long))
        differs += int((_sets(rec[:T]) != _sets(own[i, :T])).any(-1).sum())
    assert differs > 0  # the fp32 trainer's own sets differ somewhere: the replay changed something


def test_fields_config_and_errors(moe, bf16_rollout):
    rows, _ = bf16_rollout
    fields = {ROUTED_FIELD: rows[ROUTED_FIELD]}
    n_tok = sum(len(p) + len(r) for p, r in zip(rows["prompt_ids"], rows["response_ids"]))
    assert bytes_per_sample(fields) == n_tok * MC.num_layers * K / len(rows["response_ids"])
    on = validate({"name": "x", "model": MC.model_dump(), "moe": {"r3": True}})
    assert r3_fields(on) == [ROUTED_FIELD]
    assert r3_fields(validate({"name": "x", "model": MC.model_dump()})) == []
    with pytest.raises(ConfigError, match="moe.r3"):
        validate({"name": "x", "moe": {"r3": True}})  # dense model
    dense, tok = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1), 0)
    with pytest.raises(ValueError, match="MoE"):
        RoutingCapture(dense)
    with pytest.raises(ValueError, match="MoE"):
        replay_from_batch(dense, {**rows, **fields}, 40)
    with pytest.raises(ValueError, match="routed experts of row 0"):
        routing_fields([torch.zeros((3, 2, 2), dtype=torch.uint8)], [2], [5], E)
    # Without the prompt: one entry per response token, placed after the prompt.
    gens_rec = [r[:-1] for r in rows[ROUTED_FIELD]]  # the engine's records
    plens, rlens = [len(p) for p in rows["prompt_ids"]], [len(r) for r in rows["response_ids"]]
    resp_only = routing_fields(gens_rec, plens, rlens, E, with_prompt=False)[ROUTED_FIELD]
    assert [len(x) for x in resp_only] == rlens
    e_full, m_full = build_replay(plens, rlens, 64, rows[ROUTED_FIELD], E)
    e_resp, m_resp = build_replay(plens, rlens, 64, resp_only, E)
    for i, p in enumerate(plens):
        assert not m_resp[i, :p].any() and torch.equal(m_resp[i, p:], m_full[i, p:])
        assert torch.equal(e_resp[i, p:], e_full[i, p:])
    with pytest.raises(ValueError, match="entries"):
        build_replay(plens, rlens, 64, [x[:-2] for x in rows[ROUTED_FIELD]], E)
    bad = [r.clone() for r in rows[ROUTED_FIELD]]
    bad[0][0, 0, 0] = E  # not an expert (and not the NOT_ROUTED marker)
    with pytest.raises(ValueError, match="outside"):
        build_replay(plens, rlens, 64, bad, E)


@pytest.mark.slow
def test_routing_fields_survive_the_bus_round_trip(bf16_rollout):
    """One real bus (Ray + TransferQueue) round trip: uint8 [T, layers, k] per row, unchanged."""
    from relax.bus import Bus
    from relax.config import BusConfig
    from relax.cluster import RaySession  # its own temp dir; retries a raylet start that timed out

    rows, _ = bf16_rollout
    G, n = 4, 16
    fields = {k: rows[k][:n] for k in (ROUTED_FIELD, "response_ids")}
    fields[ROUTED_FIELD][0] = fields[ROUTED_FIELD][0][:0]  # an empty record must survive too
    put = {"sample_id": torch.arange(n), "group_id": torch.arange(n) // G, **fields}
    with RaySession(num_cpus=4):
        bus = Bus.start(BusConfig(capacity_rows=64), group_size=G, max_staleness=0)
        try:
            bus.put_rows(0, put)
            batch = bus.fetch(0, "t", ["sample_id", ROUTED_FIELD], max_rows=n)
            assert batch is not None and batch.size == n
            for i, s in enumerate(batch["sample_id"].tolist()):
                got = batch[ROUTED_FIELD][i]
                assert got.dtype == torch.uint8 and torch.equal(got, fields[ROUTED_FIELD][s]), s
        finally:
            bus.close()


@pytest.mark.slow
def test_verl_emulated_trainer_replays_the_routing_in_its_old_log_prob_forward(tmp_path):
    """veRL's trainer (schedule=verl) recomputes the old log-probs and the reference log-probs itself. With R3
    they replay the rollout's experts as the training forward does: the training forward runs on the very
    weights the old log-probs were taken with, so their ratio is 1 on every token (approx_kl ~ 0). Had the
    old-log-prob forward routed by itself, every bf16-vs-fp32 routing flip would show in approx_kl."""
    from pathlib import Path

    from analysis.results import load_metrics
    from relax.config import load_config
    from relax.controller import run_experiment

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "experiments/r3_moe/cpu.yaml",
                      ["schedule=verl", "moe.r3=true", "steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4",
                       "warmup.steps=20", "task.eval_size=8", "model.hidden_size=64", "model.intermediate_size=192",
                       "rollout.max_new_tokens=8"])
    run_dir, summary = run_experiment(cfg, out=tmp_path, run="verl-r3", progress=False)
    metrics = load_metrics(run_dir)
    assert summary["schedule"] == "verl" and summary["samples_lost"] == 0
    assert list(metrics.step) == [0, 1]
    assert (metrics.approx_kl.abs() < 1e-9).all(), list(metrics.approx_kl)  # unreplayed: 6e-7, 2e-6
    # The rollout's routing reached the trainer and was replayed (the gap to the engine is measured there).
    assert (metrics.logp_gap_abs > 0).all()


def test_flip_decomposition_locates_routing_flips_by_token():
    """experiments.r3_moe.study.flips/decomposition: which response tokens a routing flip touches, and the share of
    the gap on them (hand-built records: no model)."""
    from experiments.r3_moe.study import decomposition, flips

    P, R, layers = 3, 3, 2
    rec = torch.tensor([[[0, 1], [2, 3]]] * (P + R), dtype=torch.uint8)  # [T, layers, k]
    rec[-1] = NOT_ROUTED[torch.uint8]
    rows = {"prompt_ids": [torch.zeros(P, dtype=torch.long)] * 2, "response_ids": [torch.zeros(R, dtype=torch.long)] * 2,
            ROUTED_FIELD: [rec, rec.clone()]}
    own = rec[:-1].to(torch.long).expand(2, -1, -1, -1).clone()  # [B, W, layers, k], same sets
    own = torch.cat([own, torch.zeros(2, 1, layers, K, dtype=torch.long)], 1)  # a padding column
    own[0, P, 1] = torch.tensor([2, 4])  # row 0: position P (feeds response token 1), layer 1
    own[1, 0, 0] = torch.tensor([1, 0])  # row 1: same set, other order: not a flip
    own[1, 1, 0] = torch.tensor([0, 5])  # row 1: a prompt flip
    fl = flips(own, rows)
    assert [x.tolist() for x in fl["at"]] == [[False, True, False], [False, False, False]]
    assert [x.tolist() for x in fl["response"]] == [[False, True, True], [False, False, False]]
    assert [x.tolist() for x in fl["prompt"]] == [[False] * 3, [True] * 3]
    d_off = torch.tensor([0.1, 0.5, 0.2, 0.1, 0.1, 0.1])
    d_on = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    out = decomposition(fl, d_off, d_on)
    assert out["pairs_flipped"] == pytest.approx(2 / (2 * 5 * layers))
    at = out["flip_at"]
    assert at["tokens_share"] == pytest.approx(1 / 6) and at["mean_abs_off"] == pytest.approx(0.5)
    assert at["share_of_abs_off"] == pytest.approx(0.5 / 1.1) and at["share_of_removed"] == pytest.approx(0.4 / 0.5)
    assert out["no_flip_at"]["mean_abs_on"] == pytest.approx(0.1)
    assert out["flip_anywhere"]["tokens_share"] == pytest.approx(5 / 6)
    # With the trainer's gate weights (aligned with `own`): the weight a flip moves is the trainer's gate on the
    # experts the engine did not pick (row 0: expert 4 of {2, 4}; row 1: expert 5 of {0, 5}).
    gates = torch.full(own.shape, 0.5)
    gates[0, P, 1] = torch.tensor([0.7, 0.3])
    gates[1, 1, 0] = torch.tensor([0.9, 0.1])
    out = decomposition(flips(own, rows, gates), d_off, d_on)
    assert out["swapped_gate_mean"] == pytest.approx((0.3 + 0.1) / 2)
    # The paired bootstrap interval of the reduction: every row cut by half -> 50% whatever the resample.
    from experiments.r3_moe.study import reduction_ci

    ci = reduction_ci([torch.tensor([0.2, -0.4]), torch.tensor([0.1])], [torch.tensor([0.1, -0.2]), torch.tensor([0.05])])
    assert ci["mean_abs"] == pytest.approx([50.0, 50.0])


def test_mismatch_study_measures_each_trainer_precision_on_the_same_rows():
    """experiments.r3_moe.study.mismatch on a tiny config (strongly routed random weights, 16 rows): the config's
    bf16 trainer and, beside it, fp32 and bf16-weights trainers, each R3 off/on on the same engine rows."""
    from relax.config import load_config
    from experiments.r3_moe.study import TRAINERS, mismatch

    cfg = load_config("experiments/r3_moe/cpu.yaml", [
        f"model.{k}={v}" for k, v in MC.model_dump().items() if k in (
            "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "num_experts",
            "experts_per_token")] + ["rollout.group_size=8", "rollout.max_new_tokens=6"])
    assert cfg.training.precision == "bf16"  # the study's config trains in bf16, as the paper's Megatron
    model, _ = _model()
    out = mismatch(cfg, state_dict_cpu(model), n_groups=2)
    assert out["trainer_precision"] == "bf16" and out["rows"] == 16 and set(out["trainers"]) == set(TRAINERS)
    assert out["trainers"]["bf16"]["r3_on"] == out["r3_on"]  # the config's own trainer is the headline
    for name, g in out["trainers"].items():
        for m in ("mean_abs", "kl_k3"):
            lo, hi = g["reduction_ci95"][m]
            assert lo <= hi, (name, m)
    # Replay helps the bf16 trainer here (routing flips dominate a strongly routed random model).
    assert out["r3_on"]["mean_abs"] < out["r3_off"]["mean_abs"]
    assert 0 < out["flips"]["swapped_gate_mean"] < 1


def test_update_reference_copies_the_study_and_records_its_load(tmp_path):
    """relax study r3_moe --update-reference: r3_results.json, the runs' small files, a README with the command,
    commit, start and load average (what the lead needs to re-run it)."""
    import json

    from experiments.r3_moe.study import update_reference

    run = tmp_path / "out" / "r3_moe" / "cpu" / "relax-r3off-1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "final_weights.safetensors").write_bytes(b"x")  # weights never go to the reference
    res = {"argv": ["--out", "out"], "commit": "abc1234", "started": "2026-11-30 11:39 UTC", "wall_s": 60,
           "load_start": [2.5, 3.0, 4.0], "load_end": [6.0, 5.0, 4.0], "environment": {"cpus": 2},
           "runs": {"relax": {"off": [{"run": str(run)}], "on": []}},
           "mismatch": {"warmup": {"engine_dtype": "bfloat16", "trainer_precision": "bf16",
                                   "r3_on_reduction_pct": {"mean_abs": 19.0, "kl_k3": 63.0},
                                   "r3_on_reduction_ci95": {"mean_abs": [10, 27], "kl_k3": [33, 78]}}}}
    path = tmp_path / "out" / "r3_moe" / "r3_results.json"
    path.write_text(json.dumps(res))
    ref = tmp_path / "reference" / "r3_moe"
    (ref / "stale").mkdir(parents=True)
    update_reference(res, path, ref)
    assert sorted(p.relative_to(ref).as_posix() for p in ref.rglob("*") if p.is_file()) == [
        "README.md", "cpu/relax-r3off-1/metrics.jsonl", "r3_results.json"]
    text = (ref / "README.md").read_text()
    assert "abc1234" in text and "[2.5, 3.0, 4.0]" in text and "--update-reference" in text
    assert "19% (95%: 10..27%)" in text and "bf16 trainer" in text


def test_study_variants_parse_into_valid_configs():
    """The study's default variants and the shapes kept in SHAPES are valid override lists for the config (shell
    quoting keeps a YAML mapping in one override); the short-answer variant is the arithmetic task, the config's
    own task the long-sequence Caesar cipher."""
    import shlex

    from relax.config import load_config
    from experiments.r3_moe.study import SHAPES, SHORT_ANSWERS, VARIANTS

    base = load_config("experiments/r3_moe/cpu.yaml")
    assert base.task.name == "caesar_cipher" and base.rollout.max_new_tokens >= 44
    for v in VARIANTS + SHAPES:
        load_config("experiments/r3_moe/cpu.yaml", shlex.split(v))
    short = load_config("experiments/r3_moe/cpu.yaml", shlex.split(SHORT_ANSWERS))
    assert short.task.name == "basic_arithmetic" and short.task.params["operators"] == ["+", "-"]
    assert short.rollout.max_new_tokens == 8 and short.model == base.model
