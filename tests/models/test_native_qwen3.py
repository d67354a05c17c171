"""The native Qwen3 (relax/models/native_qwen3.py) is transformers' Qwen3: the same parameter names, and the same
logits on right-padded rows once it holds the same weights; config errors name the field."""

import pytest
import torch

from relax.config import ConfigError, ModelConfig, load_config
from relax.models import build_model, native_shape, state_dict_cpu


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("shape", [dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
                                   dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96)])
def test_same_names_and_logits_as_transformers(shape, tie):
    hf, tok = build_model(ModelConfig(kind="tiny_qwen3", tie_embeddings=tie, **shape), seed=1)
    nat, _ = build_model(ModelConfig(kind="tiny_qwen3", implementation="native", tie_embeddings=tie, **shape), seed=2)
    assert sorted(state_dict_cpu(hf)) == sorted(state_dict_cpu(nat))
    assert not torch.equal(hf.lm_head.weight, nat.lm_head.weight)  # seeded apart: the copy below is what matches
    nat.load_state_dict(hf.state_dict(), strict=True)
    B, L = 5, 37
    ids = torch.randint(3, tok.vocab_size, (B, L), generator=torch.Generator().manual_seed(0))
    attn = torch.ones(B, L, dtype=torch.long)
    for i in range(B):
        attn[i, L - 4 * i:] = 0  # right padding, as the trainers pack rows
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=attn).logits
        b = nat(input_ids=ids, attention_mask=attn).logits
    real = attn.bool()
    torch.testing.assert_close(b[real], a[real], rtol=1e-5, atol=1e-5)
    # positions given explicitly (the engines pass them) mean the same as the default
    pos = torch.arange(L).expand(B, L)
    with torch.no_grad():
        torch.testing.assert_close(nat(input_ids=ids, attention_mask=attn, position_ids=pos).logits[real], b[real])
    assert native_shape(ModelConfig(**shape), tok.vocab_size).head_dim == shape["hidden_size"] // shape["num_heads"]


def test_native_trains():
    nat, tok = build_model(ModelConfig(kind="tiny_qwen3", implementation="native", hidden_size=32, num_layers=1,
                                       num_heads=2, num_kv_heads=1, intermediate_size=64), seed=0)
    ids = torch.randint(3, tok.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(nat.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        logits = nat(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_native_is_a_dense_tiny_qwen3_only(tmp_path):
    with pytest.raises(ValueError, match="model.implementation"):
        ModelConfig(kind="tiny_qwen3_moe", implementation="native")
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nmodel: {kind: tiny_qwen3, implementation: jax}\n")
    with pytest.raises(ConfigError, match="implementation"):
        load_config(p)
