"""Policy models: tiny Qwen3 (dense or MoE) built from config, SmolLM2-135M from its package, or a local HF folder.

`build_model(cfg, seed)` returns `(model, tokenizer)`; the tokenizer has `encode(text) -> ids` (with BOS
where the model uses one), `decode(ids)`, `eos_token_id` and `pad_token_id`.
"""

from __future__ import annotations

import os

import torch

from relax.config import ModelConfig
from relax.models.tokenizer import CharTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network at run time, ever


class HFTokenizer:
    """Adapts a transformers tokenizer to the small interface the engines and trainers use."""

    def __init__(self, tok):
        self.tok = tok
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_bos)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def tiny_config(cfg: ModelConfig, vocab_size: int):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=cfg.tie_embeddings,
        pad_token_id=CharTokenizer.pad_token_id,
        bos_token_id=CharTokenizer.bos_token_id,
        eos_token_id=CharTokenizer.eos_token_id,
    )
    if cfg.kind == "tiny_qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            **common,
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.experts_per_token,
            moe_intermediate_size=cfg.intermediate_size // 2,
            decoder_sparse_step=1,
            norm_topk_prob=True,
            output_router_logits=False,
        )
    from transformers import Qwen3Config

    return Qwen3Config(**common)


def native_shape(cfg: ModelConfig, vocab_size: int):
    """`tiny_config`'s dense Qwen3 fields for relax/models/native_qwen3.py (no transformers import)."""
    from relax.models.native_qwen3 import Qwen3Shape

    return Qwen3Shape(vocab_size=vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                      head_dim=cfg.hidden_size // cfg.num_heads, intermediate_size=cfg.intermediate_size,
                      max_position_embeddings=cfg.max_position, tie_word_embeddings=cfg.tie_embeddings,
                      pad_token_id=CharTokenizer.pad_token_id, bos_token_id=CharTokenizer.bos_token_id,
                      eos_token_id=CharTokenizer.eos_token_id)


def build_model(cfg: ModelConfig, seed: int = 0):
    """Build the policy model and its tokenizer (random init for tiny kinds, seeded)."""
    if cfg.implementation == "native":
        from relax.models.native_qwen3 import NativeQwen3ForCausalLM

        tok = CharTokenizer()
        torch.manual_seed(seed)
        return NativeQwen3ForCausalLM(native_shape(cfg, tok.vocab_size)).float(), tok
    if cfg.kind in ("tiny_qwen3", "tiny_qwen3_moe"):
        from transformers import AutoModelForCausalLM

        tok = CharTokenizer()
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(cfg, tok.vocab_size))
        return model.float(), tok
    if cfg.kind == "tiny_omni":
        from relax.omni.model import build_tiny_omni
        from relax.omni.tokenizer import OmniTokenizer

        model = build_tiny_omni(cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
                                cfg.intermediate_size, cfg.max_position, seed)
        return model, OmniTokenizer()
    if cfg.kind == "smollm2":
        from relax.models.smollm2 import load_smollm2

        model, tok = load_smollm2()
        return model.float(), HFTokenizer(tok)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(cfg.path, torch_dtype=torch.float32)
    return model, HFTokenizer(AutoTokenizer.from_pretrained(cfg.path))


def build_tokenizer(cfg: ModelConfig):
    """The tokenizer alone (roles that only read text, e.g. Reward, need no weights)."""
    if cfg.kind in ("tiny_qwen3", "tiny_qwen3_moe"):
        return CharTokenizer()
    if cfg.kind == "tiny_omni":
        from relax.omni.tokenizer import OmniTokenizer

        return OmniTokenizer()
    from transformers import AutoTokenizer

    if cfg.kind == "smollm2":
        from relax.models.smollm2 import smollm2_cache_dir

        return HFTokenizer(AutoTokenizer.from_pretrained(smollm2_cache_dir()))
    return HFTokenizer(AutoTokenizer.from_pretrained(cfg.path))


def state_dict_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached contiguous copy of the weights, the unit of weight sync (tied weights appear once)."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen[t.data_ptr()] = name
        out[name] = t.detach().to("cpu", copy=True).contiguous()
    return out
