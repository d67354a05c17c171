"""Model shapes for the cost model: layer counts and widths, from which parameters, FLOPs and bytes follow.

Where they come from, in order: the experiment's `model` section (tiny_qwen3 / tiny_qwen3_moe build exactly these
shapes), a `config.json` in `model.path` (a cluster's local Hugging Face folder), or a shapes file in
relax/sim/models/ named after the folder (`/models/Qwen3-4B` -> qwen3-4b.yaml, copied from the model's
config.json). Parameter totals are derived from the shapes, never typed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

from relax.config import ConfigError, ExperimentConfig

HERE = Path(__file__).resolve().parent / "models"
CHAR_VOCAB = 98  # relax/models/tokenizer.py CharTokenizer: pad/bos/eos + printable ASCII (checked by a test)


@dataclass(frozen=True)
class Tower:
    """A media encoder in front of the language model (an omni model's vision or audio tower): a pre-norm
    transformer whose `positions_per_token` encoder positions make one of the language model's media tokens (a
    vision tower's spatial merge packs merge^2 patches into a token). `trained: false` (frozen) costs one forward in
    every pass over the sample, training included; trained, three."""

    name: str
    layers: int
    hidden_size: int
    intermediate_size: int
    positions_per_token: float
    trained: bool = False

    @property
    def params(self) -> int:  # per layer: q, k, v, o and a two-matrix MLP (biases and norms left out)
        h = self.hidden_size
        return self.layers * (4 * h * h + 2 * h * self.intermediate_size)

    def forward_flops_per_token(self) -> float:
        """2 x params per encoder position (the encoder's own attention over a clip's patches left out)."""
        return 2.0 * self.params * self.positions_per_token


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    num_experts: int = 0  # 0: dense
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    towers: tuple[Tower, ...] = ()  # media encoders (omni models); their tokens' share of a prompt: the length file
    source: str = ""

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def attn_params(self) -> int:  # per layer: q, k, v, o projections and the q/k norms
        h, d = self.hidden_size, self.head_dim
        return h * self.num_heads * d * 2 + 2 * h * self.num_kv_heads * d + 2 * d

    @cached_property
    def expert_params(self) -> int:  # one SwiGLU expert (gate, up, down)
        return 3 * self.hidden_size * self.moe_intermediate_size

    @cached_property
    def mlp_params(self) -> int:  # per layer, all of it
        if self.moe:
            return self.num_experts * self.expert_params + self.hidden_size * self.num_experts
        return 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def mlp_active_params(self) -> int:  # per layer, what one token passes through
        if self.moe:
            return self.experts_per_token * self.expert_params + self.hidden_size * self.num_experts
        return self.mlp_params

    @cached_property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @cached_property
    def layer_params(self) -> int:
        return self.attn_params + self.mlp_params + 2 * self.hidden_size

    @cached_property
    def total_params(self) -> int:
        return self.num_layers * self.layer_params + self.embedding_params + self.hidden_size

    @cached_property
    def active_params(self) -> int:
        """Parameters one token's forward multiplies through (the 2N / 6N of FLOP counts): every layer's
        attention and active MLP, and the output head (a matmul even when tied to the embedding)."""
        per_layer = self.attn_params + self.mlp_active_params
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size

    @cached_property
    def attn_width(self) -> int:  # heads x head_dim: the width of QK^T and AV
        return self.num_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def expert_params_touched(self, tokens: float) -> float:
        """MoE decode: parameters read in one step of `tokens` tokens (the experts some token routes to, under
        uniform routing: E x (1 - (1 - k/E)^tokens) per layer), plus attention and the head; dense: all."""
        if not self.moe:
            return float(self.total_params)
        E, k = self.num_experts, self.experts_per_token
        touched = E * (1.0 - (1.0 - k / E) ** max(tokens, 1.0))
        per_layer = self.attn_params + touched * self.expert_params + self.hidden_size * E
        return self.num_layers * per_layer + self.embedding_params


FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
          "tie_embeddings", "num_experts", "experts_per_token", "moe_intermediate_size")


def _from_hf_config(d: dict, source: str) -> ModelShape:
    try:
        return ModelShape(
            hidden_size=d["hidden_size"], num_layers=d["num_hidden_layers"], num_heads=d["num_attention_heads"],
            num_kv_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
            intermediate_size=d.get("intermediate_size", 0), vocab_size=d["vocab_size"],
            tie_embeddings=bool(d.get("tie_word_embeddings", False)), num_experts=d.get("num_experts", 0) or 0,
            experts_per_token=d.get("num_experts_per_tok", 0) or 0,
            moe_intermediate_size=d.get("moe_intermediate_size", 0) or 0, source=source)
    except KeyError as err:
        raise ConfigError(f"{source}: model config lacks {err.args[0]}") from None


def _towers(raw: list, where: str) -> tuple[Tower, ...]:
    out = []
    for i, t in enumerate(raw or []):
        try:
            out.append(Tower(**{k: v for k, v in t.items() if k != "source"}))
        except TypeError as err:
            raise ConfigError(f"{where}: towers.{i}: {err}") from None
    return tuple(out)


def load_shape_file(path: Path) -> ModelShape:
    raw = yaml.safe_load(path.read_text()) or {}
    unknown = set(raw) - set(FIELDS) - {"source", "towers"}
    if unknown:
        raise ConfigError(f"{path.name}: unknown field(s) {', '.join(sorted(unknown))}")
    missing = [f for f in FIELDS[:7] if f not in raw]
    if missing:
        raise ConfigError(f"{path.name}: missing field(s) {', '.join(missing)}")
    return ModelShape(**{k: raw[k] for k in FIELDS if k in raw}, towers=_towers(raw.get("towers"), path.name),
                      source=raw.get("source", path.name))


def model_shape(cfg: ExperimentConfig) -> ModelShape:
    """The policy's shapes for `cfg` (ConfigError naming model.path when they cannot be found)."""
    m = cfg.model
    if m.kind in ("tiny_qwen3", "tiny_qwen3_moe", "tiny_omni"):
        # relax/models/__init__.py tiny_config: head_dim = hidden / heads; MoE experts are intermediate / 2 wide
        moe = m.kind == "tiny_qwen3_moe"
        return ModelShape(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                          num_kv_heads=m.num_kv_heads, head_dim=m.hidden_size // m.num_heads,
                          intermediate_size=m.intermediate_size, vocab_size=CHAR_VOCAB,
                          tie_embeddings=m.tie_embeddings, num_experts=m.num_experts if moe else 0,
                          experts_per_token=m.experts_per_token if moe else 0,
                          moe_intermediate_size=m.intermediate_size // 2 if moe else 0,
                          source=f"model section ({m.kind})")
    if m.kind == "smollm2":
        return load_shape_file(HERE / "smollm2-135m.yaml")
    path = Path(m.path or "")
    if (path / "config.json").exists():
        return _from_hf_config(json.loads((path / "config.json").read_text()), str(path / "config.json"))
    known = HERE / f"{path.name.lower()}.yaml"
    if known.exists():
        return load_shape_file(known)
    have = ", ".join(sorted(p.stem for p in HERE.glob("*.yaml")))
    raise ConfigError(f"model.path: no config.json in '{m.path}' and no shapes file relax/sim/models/"
                      f"{path.name.lower()}.yaml (known: {have})")
