"""A dense Qwen3 in plain torch: the architecture and parameter names of transformers' `Qwen3ForCausalLM`
(`model.safetensors` of one loads into the other), without transformers' per-call machinery or its import.

Why: the emulated runs' stand-in policy (relax/emulate/) is a 1-layer, hidden-32 Qwen3 whose forward is mostly
framework overhead. There, every real millisecond weighs `emulate.compression` modelled ones, and each model
process pays transformers' ~4 s import. `model.implementation: native` selects this module; the CPU runs keep
transformers' model, whose initialisation their committed results depend on.

What it covers is what the engine calls on a policy: `model(input_ids, attention_mask, position_ids).logits`
for right-padded rows (no KV cache: the emulated engine generates no tokens), `named_parameters` /
`state_dict` with HF names, and `config`. Checked against transformers in tests/models/test_native_qwen3.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Qwen3Shape:
    """The fields of transformers' `Qwen3Config` this model reads (same names and defaults)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None


@dataclass
class CausalLMOutput:
    logits: torch.Tensor


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: Qwen3Shape):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps)  # Qwen3: per-head norm of queries and keys
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, L, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, L, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, c: Qwen3Shape):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: Qwen3Shape):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """`Qwen3Model`: the names under `model.` in a checkpoint."""

    def __init__(self, c: Qwen3Shape):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class NativeQwen3ForCausalLM(nn.Module):
    def __init__(self, config: Qwen3Shape):
        super().__init__()
        self.config = config
        self.model = Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        inv = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)
        for m in self.modules():  # transformers' Qwen3 init: normal(0, initializer_range), norms at one
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=config.initializer_range)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **_) -> CausalLMOutput:
        B, L = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(L, device=input_ids.device).expand(B, L)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, L, head_dim]
        cos, sin = emb.cos(), emb.sin()
        mask = torch.ones(L, L, dtype=torch.bool, device=input_ids.device).tril()[None, None]
        if attention_mask is not None:  # keys at padding are never attended to
            mask = mask & attention_mask.bool()[:, None, None, :]
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return CausalLMOutput(self.lm_head(self.model.norm(x)))
