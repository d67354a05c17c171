"""HF <-> Megatron conversion for tiny Qwen3 dense and MoE models built with transformers."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from relax.config import ModelConfig
from relax.models import build_model
from relax.trainers.megatron import (
    Parallel,
    QwenLayout,
    hf_state_from_model,
    hf_to_megatron,
    hf_to_megatron_shards,
    megatron_shards_to_hf,
    model_state_from_hf,
)
from relax.trainers.megatron.convert import pack_experts, qkv_from_megatron

# 4 query heads in 2 groups (GQA), head_dim 8; MoE: 4 experts, top-2, expert ffn 32.
TINY = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, num_experts=4,
            experts_per_token=2)


@pytest.fixture(scope="module", params=["tiny_qwen3", "tiny_qwen3_moe"])
def tiny(request):
    model, _ = build_model(ModelConfig(kind=request.param, **TINY), seed=3)
    return request.param, model, hf_state_from_model(model)


def _same(a: dict, b: dict):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("layout", [("te_grouped", True), ("sequential", False), ("grouped_gemm", True)])
def test_round_trip_is_exact(tiny, tp, layout):
    kind, model, hf = tiny
    L = QwenLayout.from_hf_config(model.config, tp=tp, expert_layout=layout[0], fused_norms=layout[1])
    for par in [Parallel(tp=tp), Parallel(tp=tp, pp=2)] + ([Parallel(tp=tp, ep=2), Parallel(tp=tp, ep=2, etp=1)]
                                                          if kind.endswith("moe") else []):
        shards = hf_to_megatron_shards(hf, L, par)
        assert len(shards) == par.tp * par.pp * par.ep
        _same(megatron_shards_to_hf(shards, L, par), hf)


def test_qkv_is_interleaved_per_query_group_and_tp_splits_whole_groups(tiny):
    _, model, hf = tiny
    L = QwenLayout.from_hf_config(model.config, tp=2)
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    d, hpg = L.head_dim, L.heads_per_group  # 8, 2
    qkv = hf_to_megatron(hf, L)["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == ((L.num_heads + 2 * L.num_kv_heads) * d, L.hidden_size)
    # group 1 = query heads 2, 3, then key head 1, then value head 1
    g1 = qkv[(hpg + 2) * d:]
    assert torch.equal(g1[: hpg * d], q[hpg * d: 2 * hpg * d])
    assert torch.equal(g1[hpg * d: (hpg + 1) * d], k[d: 2 * d])
    assert torch.equal(g1[(hpg + 1) * d:], v[d: 2 * d])
    # TP rank 1 holds exactly query group 1
    shards = hf_to_megatron_shards(hf, L, Parallel(tp=2))
    r1 = shards[(0, 1, 0)]["decoder.layers.0.self_attention.linear_qkv.weight"]
    q1, k1, v1 = qkv_from_megatron(r1, L.with_(num_heads=L.num_heads // 2, num_kv_heads=L.num_kv_heads // 2))
    assert torch.equal(q1, q[hpg * d:]) and torch.equal(k1, k[d:]) and torch.equal(v1, v[d:])


def test_dense_fc1_is_gate_then_up_and_each_tp_rank_holds_both_halves():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3", **TINY), seed=1)
    hf = hf_state_from_model(model)
    L = QwenLayout.from_hf_config(model.config, tp=2)
    gate, up = hf["model.layers.1.mlp.gate_proj.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    full = hf_to_megatron(hf, L)
    assert torch.equal(full["decoder.layers.1.mlp.linear_fc1.weight"], torch.cat([gate, up]))
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in full  # TE spec fuses the post-attention norm
    shards = hf_to_megatron_shards(hf, L, Parallel(tp=2))
    f = gate.shape[0] // 2
    r1 = shards[(0, 1, 0)]["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(r1, torch.cat([gate[f:], up[f:]]))
    fc2 = shards[(0, 1, 0)]["decoder.layers.1.mlp.linear_fc2.weight"]
    assert torch.equal(fc2, hf["model.layers.1.mlp.down_proj.weight"][:, f:])  # row-parallel: split columns


def test_vocab_is_padded_for_megatron_and_trimmed_back():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3", **TINY), seed=1)
    hf = hf_state_from_model(model)
    L = QwenLayout.from_hf_config(model.config, tp=2)
    assert L.padded_vocab == 256 and L.vocab_size == 98
    emb = hf_to_megatron(hf, L)["embedding.word_embeddings.weight"]
    assert emb.shape[0] == 256 and not emb[98:].any()
    assert "output_layer.weight" not in hf_to_megatron(hf, L.with_(tie_embeddings=True))
    untied = L.with_(tie_embeddings=False)
    hf2 = dict(hf, **{"lm_head.weight": torch.randn_like(hf["model.embed_tokens.weight"])})
    _same(megatron_shards_to_hf(hf_to_megatron_shards(hf2, untied, Parallel(tp=2, pp=2)), untied, Parallel(tp=2, pp=2)),
          hf2)


def test_expert_layouts_hold_the_same_experts():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3_moe", **TINY), seed=2)
    hf = hf_state_from_model(model)
    L = QwenLayout.from_hf_config(model.config)
    assert L.moe_layers == (0, 1) and L.num_experts == 4 and L.moe_ffn_hidden_size == 32
    gate = hf["model.layers.0.mlp.experts.2.gate_proj.weight"]
    up = hf["model.layers.0.mlp.experts.2.up_proj.weight"]
    down = hf["model.layers.0.mlp.experts.2.down_proj.weight"]
    seq = hf_to_megatron(hf, L.with_(expert_layout="sequential"))
    assert torch.equal(seq["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"], torch.cat([gate, up]))
    te = hf_to_megatron(hf, L)
    assert torch.equal(te["decoder.layers.0.mlp.experts.linear_fc2.weight2"], down)
    assert torch.equal(te["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in te  # MoE layers never fuse the norm
    # grouped GEMM: Megatron views weight1 as [E, H, 2F] and computes x @ w1[e] (trans_b=False)
    gg = hf_to_megatron(hf, L.with_(expert_layout="grouped_gemm"))
    w1 = gg["decoder.layers.0.mlp.experts.weight1"]
    w2 = gg["decoder.layers.0.mlp.experts.weight2"]
    assert w1.shape == (32, 4 * 64) and w2.shape == (4 * 32, 32)
    x = torch.randn(5, 32)
    torch.testing.assert_close(x @ w1.view(4, 32, -1)[2], x @ torch.cat([gate, up]).t())
    hmid = torch.randn(5, 32)
    torch.testing.assert_close(hmid @ w2.view(4, -1, 32)[2], hmid @ down.t())


def test_expert_parallel_gives_each_rank_its_experts_renumbered():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3_moe", **TINY), seed=2)
    hf = hf_state_from_model(model)
    L = QwenLayout.from_hf_config(model.config, tp=2, expert_layout="sequential")
    shards = hf_to_megatron_shards(hf, L, Parallel(tp=2, ep=2))  # expert TP = tp = 2
    gate3 = hf["model.layers.1.mlp.experts.3.gate_proj.weight"]
    up3 = hf["model.layers.1.mlp.experts.3.up_proj.weight"]
    # global expert 3 = local expert 1 on EP rank 1; expert-TP rank 0 holds the first half of gate and of up
    mine = shards[(0, 0, 1)]["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"]
    assert torch.equal(mine, torch.cat([gate3[:16], up3[:16]]))
    assert "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight" not in shards[(0, 0, 1)]


def test_hf_model_state_round_trip_gives_identical_logits(tiny):
    kind, model, hf = tiny
    L = QwenLayout.from_hf_config(model.config, tp=2)
    back = megatron_shards_to_hf(hf_to_megatron_shards(hf, L, Parallel(tp=2, pp=2)), L, Parallel(tp=2, pp=2))
    fresh, _ = build_model(ModelConfig(kind=kind, **TINY), seed=99)
    fresh.load_state_dict(model_state_from_hf(fresh, back), strict=True)
    ids = torch.randint(3, 90, (2, 7))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


def test_full_size_layouts_shard_to_megatron_shapes():
    """Qwen3-30B-A3B shapes on the meta device (no memory): TP 4, PP 2, EP 8."""
    cfg = dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128, hidden_size=2048, num_hidden_layers=4,
               intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
               vocab_size=151936, tie_word_embeddings=False)
    L = QwenLayout.from_hf_config(cfg, tp=4)
    H, E = 2048, 128
    hf = {"model.embed_tokens.weight": torch.empty(151936, H, device="meta"), "model.norm.weight": torch.empty(H, device="meta"),
          "lm_head.weight": torch.empty(151936, H, device="meta")}
    for i in range(4):
        p = f"model.layers.{i}."
        hf.update({p + "input_layernorm.weight": torch.empty(H, device="meta"),
                   p + "post_attention_layernorm.weight": torch.empty(H, device="meta"),
                   p + "self_attn.q_proj.weight": torch.empty(32 * 128, H, device="meta"),
                   p + "self_attn.k_proj.weight": torch.empty(4 * 128, H, device="meta"),
                   p + "self_attn.v_proj.weight": torch.empty(4 * 128, H, device="meta"),
                   p + "self_attn.o_proj.weight": torch.empty(H, 32 * 128, device="meta"),
                   p + "self_attn.q_norm.weight": torch.empty(128, device="meta"),
                   p + "self_attn.k_norm.weight": torch.empty(128, device="meta"),
                   p + "mlp.gate.weight": torch.empty(E, H, device="meta")})
        for e in range(E):
            hf[f"{p}mlp.experts.{e}.gate_proj.weight"] = torch.empty(768, H, device="meta")
            hf[f"{p}mlp.experts.{e}.up_proj.weight"] = torch.empty(768, H, device="meta")
            hf[f"{p}mlp.experts.{e}.down_proj.weight"] = torch.empty(H, 768, device="meta")
    par = Parallel(tp=4, pp=2, ep=8)
    shards = hf_to_megatron_shards(hf, L, par)
    r = shards[(1, 3, 7)]
    assert r["decoder.layers.1.self_attention.linear_qkv.weight"].shape == ((32 + 8) * 128 // 4, H)
    assert r["decoder.layers.1.self_attention.linear_proj.weight"].shape == (H, 32 * 128 // 4)
    assert r["decoder.layers.1.mlp.experts.linear_fc1.weight15"].shape == (2 * 768 // 4, H)
    assert "decoder.layers.1.mlp.experts.linear_fc1.weight16" not in r  # 128 experts / EP 8 = 16 local
    assert r["output_layer.weight"].shape == (151936 // 4 + 32, H)  # padded to 152064 = 128 * 4 * 297
    assert "embedding.word_embeddings.weight" not in r and "decoder.layers.2.mlp.router.weight" not in r


def test_bad_parallel_layout_names_the_problem():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3", **TINY), seed=1)
    L = QwenLayout.from_hf_config(model.config)
    with pytest.raises(ValueError, match="num_kv_heads=2 is not divisible by tp=4"):
        hf_to_megatron_shards(hf_state_from_model(model), L, Parallel(tp=4))


_GPTMODEL_CHECK = textwrap.dedent("""
    import json, os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from relax.config import ModelConfig
    from relax.models import build_model
    from relax.trainers.megatron import Parallel, QwenLayout, hf_state_from_model, hf_to_megatron_shards
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    kind = sys.argv[1]
    tiny = json.loads(sys.argv[3])
    hf_model, _ = build_model(ModelConfig(kind=kind, **tiny), seed=0)
    L = QwenLayout.from_hf_config(hf_model.config, fused_norms=False, expert_layout="sequential")
    moe = dict(num_moe_experts=L.num_experts, moe_router_topk=L.topk, moe_ffn_hidden_size=L.moe_ffn_hidden_size,
               moe_token_dispatcher_type="allgather") if L.num_experts else {}
    cfg = TransformerConfig(num_layers=L.num_layers, hidden_size=L.hidden_size, num_attention_heads=L.num_heads,
        num_query_groups=L.num_kv_heads, kv_channels=L.head_dim, ffn_hidden_size=L.ffn_hidden_size,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, qk_layernorm=True, use_cpu_initialization=True, **moe)
    spec = get_gpt_layer_local_spec(num_experts=L.num_experts or None, qk_layernorm=True)
    m = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=L.padded_vocab, max_sequence_length=64,
                 share_embeddings_and_output_weights=L.tie_embeddings, position_embedding_type="rope")
    mine = hf_to_megatron_shards(hf_state_from_model(hf_model), L, Parallel())[(0, 0, 0)]
    theirs = {k: tuple(v.shape) for k, v in m.state_dict().items() if not k.endswith("_extra_state")}
    res = m.load_state_dict(mine, strict=False)
    print(json.dumps({"ours": {k: tuple(v.shape) for k, v in mine.items()}, "theirs": theirs,
                      "missing": [k for k in res.missing_keys if not k.endswith("_extra_state")],
                      "unexpected": list(res.unexpected_keys),
                      "loaded": all(torch.equal(m.state_dict()[k], v) for k, v in mine.items())}))
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_names_and_shapes_match_a_real_megatron_gptmodel(kind, tmp_path):
    """Megatron-Core builds (not runs) on CPU: our shard loads into its GPTModel with nothing missing or extra."""
    pytest.importorskip("megatron.core")
    port = str(29500 + (hash(kind) % 400))
    out = subprocess.run([sys.executable, "-c", _GPTMODEL_CHECK, kind, port, json.dumps(TINY)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["missing"] == [] and res["unexpected"] == []
    assert res["ours"] == res["theirs"]
    assert res["loaded"]


def test_pack_experts_rejects_nothing_silently():
    with pytest.raises(KeyError):
        QwenLayout.from_hf_config({"num_attention_heads": 4})  # missing fields name themselves
    fc1 = [torch.randn(4, 3)] * 2
    fc2 = [torch.randn(3, 2)] * 2
    L = QwenLayout(num_layers=1, hidden_size=3, num_heads=1, num_kv_heads=1, head_dim=3, ffn_hidden_size=2,
                   vocab_size=8, padded_vocab=128, expert_layout="grouped_gemm")
    packed = pack_experts(fc1, fc2, L, "p.")
    assert set(packed) == {"p.mlp.experts.weight1", "p.mlp.experts.weight2"}
