"""Hugging Face <-> Megatron-Core weight conversion for the Qwen3 family (dense and MoE). Pure tensor work.

Three naming schemes meet here:

- HF checkpoint names (what `save_pretrained` writes, what SGLang loads and what DCS sends to rollout engines):
  `model.layers.{i}.self_attn.q_proj.weight`, ..., per-expert `model.layers.{i}.mlp.experts.{e}.gate_proj.weight`.
  transformers 5 keeps MoE experts fused in memory (`mlp.experts.gate_up_proj` [E, 2F, H], `down_proj`
  [E, H, F]); `hf_state_from_model` / `model_state_from_hf` translate between the two.
- Megatron "full" names: one unsharded GPTModel state dict (`decoder.layers.{i}.self_attention.linear_qkv.weight`,
  ...), with global layer and expert indices.
- Megatron shards: what each (pipeline stage, tensor rank, expert rank) holds, with stage-local layer numbers and
  rank-local expert numbers, exactly as `GPTModel.state_dict()` names them on that rank.

Layouts that matter (checked against megatron-core 0.16 sources):
- linear_qkv rows are grouped per query group: for each of the `num_kv_heads` groups, that group's
  `num_heads / num_kv_heads` query heads, then its key head, then its value head (`head_dim` rows each).
  Tensor parallelism splits whole groups, so a rank's slice is a contiguous row block.
- linear_fc1 = [gate; up] rows; under TP each rank holds [gate_r; up_r], so split/merge handle both halves.
- linear_proj / linear_fc2 are row-parallel (split along columns).
- Transformer Engine specs fuse the input / post-attention RMSNorm into linear_qkv / linear_fc1
  (`layer_norm_weight`); the local spec keeps `input_layernorm` / `pre_mlp_layernorm`. MoE layers always use
  `pre_mlp_layernorm`.
- Experts: `sequential` (SequentialMLP: `mlp.experts.local_experts.{e}.linear_fc1.weight`), `te_grouped`
  (TEGroupedMLP: `mlp.experts.linear_fc1.weight{e}`) or `grouped_gemm` (legacy GroupedMLP: `mlp.experts.weight1`
  [H, E*2F] whose memory is [E, H, 2F], i.e. each expert's fc1 transposed; `weight2` [E*F, H] = [E, F, H]).
- The embedding (and an untied output layer) are padded to a vocabulary divisible by 128 x TP, as Megatron does;
  the padding rows are zero and are dropped on the way back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal

import torch

ExpertLayout = Literal["sequential", "te_grouped", "grouped_gemm"]


def padded_vocab_size(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary: the next multiple of divisible_by * tp."""
    m = divisible_by * tp
    return -(-vocab_size // m) * m


@dataclass(frozen=True)
class QwenLayout:
    """Shapes and naming choices of one Qwen3 / Qwen3-MoE model on the Megatron side."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab: int
    tie_embeddings: bool = True
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    topk: int = 0
    moe_layers: tuple[int, ...] = ()
    fused_norms: bool = True  # Transformer Engine spec (layer_norm_weight fused into linear_qkv / linear_fc1)
    expert_layout: ExpertLayout = "te_grouped"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_hf_config(cls, config, *, tp: int = 1, fused_norms: bool = True, expert_layout: ExpertLayout = "te_grouped",
                       vocab_divisible_by: int = 128) -> "QwenLayout":
        c = config if isinstance(config, dict) else config.to_dict()
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        experts = c.get("num_experts") or c.get("num_local_experts") or 0
        n = c["num_hidden_layers"]
        moe_layers: tuple[int, ...] = ()
        if experts:
            step = c.get("decoder_sparse_step", 1) or 1
            only = set(c.get("mlp_only_layers") or [])
            moe_layers = tuple(i for i in range(n) if i not in only and (i + 1) % step == 0)
        return cls(
            num_layers=n, hidden_size=c["hidden_size"], num_heads=heads,
            num_kv_heads=c.get("num_key_value_heads") or heads, head_dim=head_dim,
            ffn_hidden_size=c["intermediate_size"], vocab_size=c["vocab_size"],
            padded_vocab=padded_vocab_size(c["vocab_size"], tp, vocab_divisible_by),
            tie_embeddings=bool(c.get("tie_word_embeddings", False)), num_experts=experts,
            moe_ffn_hidden_size=c.get("moe_intermediate_size") or 0, topk=c.get("num_experts_per_tok") or 0,
            moe_layers=moe_layers, fused_norms=fused_norms, expert_layout=expert_layout,
        )

    def with_(self, **kw) -> "QwenLayout":
        return replace(self, **kw)

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe_layers

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


# --- HF model <-> HF checkpoint names --------------------------------------------------------------------
_FUSED_GU = re.compile(r"(.*\.mlp\.experts)\.gate_up_proj$")
_FUSED_DOWN = re.compile(r"(.*\.mlp\.experts)\.down_proj$")


def hf_state_from_model(model) -> dict[str, torch.Tensor]:
    """A transformers model's weights under checkpoint names (per-expert MoE tensors, no tied lm_head)."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach()
        if tied and name == "lm_head.weight":
            continue
        if m := _FUSED_GU.fullmatch(name):
            f = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = t[e, :f]
                out[f"{m.group(1)}.{e}.up_proj.weight"] = t[e, f:]
        elif m := _FUSED_DOWN.fullmatch(name):
            for e in range(t.shape[0]):
                out[f"{m.group(1)}.{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def model_state_from_hf(model, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint-named tensors -> a state dict `model.load_state_dict` accepts (re-fuses experts, re-ties lm_head)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        if m := _FUSED_GU.fullmatch(name):
            out[name] = torch.stack([torch.cat([hf[f"{m.group(1)}.{e}.gate_proj.weight"],
                                                hf[f"{m.group(1)}.{e}.up_proj.weight"]]) for e in range(t.shape[0])])
        elif m := _FUSED_DOWN.fullmatch(name):
            out[name] = torch.stack([hf[f"{m.group(1)}.{e}.down_proj.weight"] for e in range(t.shape[0])])
        elif name == "lm_head.weight" and name not in hf:
            out[name] = hf["model.embed_tokens.weight"]
        else:
            out[name] = hf[name]
    return out


# --- HF checkpoint names <-> Megatron full state ----------------------------------------------------------
def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    pad = t.new_zeros((rows - t.shape[0], *t.shape[1:]))
    return torch.cat([t, pad])


def qkv_to_megatron(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, L: QwenLayout) -> torch.Tensor:
    g, d, h = L.num_kv_heads, L.head_dim, q.shape[-1]
    return torch.cat([q.reshape(g, L.heads_per_group * d, h), k.reshape(g, d, h), v.reshape(g, d, h)], dim=1).reshape(-1, h)


def qkv_from_megatron(qkv: torch.Tensor, L: QwenLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, h = L.num_kv_heads, L.head_dim, qkv.shape[-1]
    q, k, v = qkv.reshape(g, (L.heads_per_group + 2) * d, h).split([L.heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, h), k.reshape(-1, h), v.reshape(-1, h)


def _expert_names(L: QwenLayout, p: str, e: int) -> tuple[str, str]:
    if L.expert_layout == "sequential":
        return f"{p}mlp.experts.local_experts.{e}.linear_fc1.weight", f"{p}mlp.experts.local_experts.{e}.linear_fc2.weight"
    if L.expert_layout == "te_grouped":
        return f"{p}mlp.experts.linear_fc1.weight{e}", f"{p}mlp.experts.linear_fc2.weight{e}"
    raise ValueError("grouped_gemm stores all experts in weight1/weight2")


def pack_experts(fc1: list[torch.Tensor], fc2: list[torch.Tensor], L: QwenLayout, p: str) -> dict[str, torch.Tensor]:
    """Per-expert fc1 [2F, H] / fc2 [H, F] (in local expert order) -> this layout's expert tensors."""
    if L.expert_layout == "grouped_gemm":
        h = fc1[0].shape[1]
        w1 = torch.stack([w.t() for w in fc1]).reshape(h, -1)  # memory [E, H, 2F], parameter view [H, E*2F]
        w2 = torch.stack([w.t() for w in fc2]).reshape(-1, h)  # [E, F, H] -> [E*F, H]
        return {f"{p}mlp.experts.weight1": w1.contiguous(), f"{p}mlp.experts.weight2": w2.contiguous()}
    out = {}
    for e, (a, b) in enumerate(zip(fc1, fc2)):
        n1, n2 = _expert_names(L, p, e)
        out[n1], out[n2] = a, b
    return out


def unpack_experts(sd: dict[str, torch.Tensor], L: QwenLayout, p: str, n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inverse of pack_experts for `n` local experts."""
    if L.expert_layout == "grouped_gemm":
        w1, w2 = sd[f"{p}mlp.experts.weight1"], sd[f"{p}mlp.experts.weight2"]
        h = w1.shape[0]
        fc1 = [t.t() for t in w1.reshape(n, h, -1)]
        fc2 = [t.t() for t in w2.reshape(n, -1, h)]
        return fc1, fc2
    fc1, fc2 = [], []
    for e in range(n):
        n1, n2 = _expert_names(L, p, e)
        fc1.append(sd[n1])
        fc2.append(sd[n2])
    return fc1, fc2


def hf_to_megatron(hf: dict[str, torch.Tensor], L: QwenLayout) -> dict[str, torch.Tensor]:
    """HF checkpoint-named tensors -> one unsharded Megatron GPTModel state dict."""
    out: dict[str, torch.Tensor] = {"embedding.word_embeddings.weight": _pad_rows(hf["model.embed_tokens.weight"], L.padded_vocab),
                                    "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not L.tie_embeddings:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], L.padded_vocab)
    for i in range(L.num_layers):
        s, p = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = s + "self_attn."
        out[p + ("self_attention.linear_qkv.layer_norm_weight" if L.fused_norms else "input_layernorm.weight")] = \
            hf[s + "input_layernorm.weight"]
        out[p + "self_attention.linear_qkv.weight"] = qkv_to_megatron(
            hf[a + "q_proj.weight"], hf[a + "k_proj.weight"], hf[a + "v_proj.weight"], L)
        out[p + "self_attention.linear_proj.weight"] = hf[a + "o_proj.weight"]
        out[p + "self_attention.q_layernorm.weight"] = hf[a + "q_norm.weight"]
        out[p + "self_attention.k_layernorm.weight"] = hf[a + "k_norm.weight"]
        post = hf[s + "post_attention_layernorm.weight"]
        if L.is_moe(i):
            out[p + "pre_mlp_layernorm.weight"] = post
            out[p + "mlp.router.weight"] = hf[s + "mlp.gate.weight"]
            fc1 = [torch.cat([hf[f"{s}mlp.experts.{e}.gate_proj.weight"], hf[f"{s}mlp.experts.{e}.up_proj.weight"]])
                   for e in range(L.num_experts)]
            fc2 = [hf[f"{s}mlp.experts.{e}.down_proj.weight"] for e in range(L.num_experts)]
            out.update(pack_experts(fc1, fc2, L, p))
        else:
            out[p + ("mlp.linear_fc1.layer_norm_weight" if L.fused_norms else "pre_mlp_layernorm.weight")] = post
            out[p + "mlp.linear_fc1.weight"] = torch.cat([hf[s + "mlp.gate_proj.weight"], hf[s + "mlp.up_proj.weight"]])
            out[p + "mlp.linear_fc2.weight"] = hf[s + "mlp.down_proj.weight"]
    return out


def megatron_to_hf(mg: dict[str, torch.Tensor], L: QwenLayout) -> dict[str, torch.Tensor]:
    """One unsharded Megatron state dict -> HF checkpoint-named tensors (vocabulary padding dropped)."""
    return dict(iter_megatron_to_hf(mg, L))


def iter_megatron_to_hf(mg: dict[str, torch.Tensor], L: QwenLayout, layers: Iterable[int] | None = None):
    """Yield (hf_name, tensor) layer by layer, so weight sync can bucket and send while it converts."""
    if layers is None:
        yield "model.embed_tokens.weight", mg["embedding.word_embeddings.weight"][: L.vocab_size]
        yield "model.norm.weight", mg["decoder.final_layernorm.weight"]
        if not L.tie_embeddings:
            yield "lm_head.weight", mg["output_layer.weight"][: L.vocab_size]
    for i in range(L.num_layers) if layers is None else layers:
        s, p = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = s + "self_attn."
        yield s + "input_layernorm.weight", mg[p + ("self_attention.linear_qkv.layer_norm_weight" if L.fused_norms
                                                    else "input_layernorm.weight")]
        q, k, v = qkv_from_megatron(mg[p + "self_attention.linear_qkv.weight"], L)
        yield a + "q_proj.weight", q
        yield a + "k_proj.weight", k
        yield a + "v_proj.weight", v
        yield a + "o_proj.weight", mg[p + "self_attention.linear_proj.weight"]
        yield a + "q_norm.weight", mg[p + "self_attention.q_layernorm.weight"]
        yield a + "k_norm.weight", mg[p + "self_attention.k_layernorm.weight"]
        if L.is_moe(i):
            yield s + "post_attention_layernorm.weight", mg[p + "pre_mlp_layernorm.weight"]
            yield s + "mlp.gate.weight", mg[p + "mlp.router.weight"]
            fc1, fc2 = unpack_experts(mg, L, p, L.num_experts)
            for e in range(L.num_experts):
                gate, up = fc1[e].chunk(2, dim=0)
                yield f"{s}mlp.experts.{e}.gate_proj.weight", gate
                yield f"{s}mlp.experts.{e}.up_proj.weight", up
                yield f"{s}mlp.experts.{e}.down_proj.weight", fc2[e]
        else:
            yield s + "post_attention_layernorm.weight", mg[p + ("mlp.linear_fc1.layer_norm_weight" if L.fused_norms
                                                                 else "pre_mlp_layernorm.weight")]
            gate, up = mg[p + "mlp.linear_fc1.weight"].chunk(2, dim=0)
            yield s + "mlp.gate_proj.weight", gate
            yield s + "mlp.up_proj.weight", up
            yield s + "mlp.down_proj.weight", mg[p + "mlp.linear_fc2.weight"]


# --- Megatron full state <-> per-rank shards (TP, PP, EP, expert TP) ---------------------------------------
@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel size; Megatron's default is tp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def check(self, L: QwenLayout) -> None:
        problems = []
        if L.num_kv_heads % self.tp:
            problems.append(f"num_kv_heads={L.num_kv_heads} is not divisible by tp={self.tp}")
        if L.ffn_hidden_size % self.tp:
            problems.append(f"ffn_hidden_size={L.ffn_hidden_size} is not divisible by tp={self.tp}")
        if L.num_layers % self.pp:
            problems.append(f"num_layers={L.num_layers} is not divisible by pp={self.pp}")
        if L.padded_vocab % self.tp:
            problems.append(f"padded vocab {L.padded_vocab} is not divisible by tp={self.tp}")
        if L.num_experts:
            if L.num_experts % self.ep:
                problems.append(f"num_experts={L.num_experts} is not divisible by ep={self.ep}")
            if self.expert_tp not in (1, self.tp):
                problems.append(f"expert tp={self.expert_tp} must be 1 or tp={self.tp}")
            if L.moe_ffn_hidden_size % self.expert_tp:
                problems.append(f"moe_ffn_hidden_size={L.moe_ffn_hidden_size} is not divisible by expert tp={self.expert_tp}")
        elif self.ep != 1:
            problems.append("ep > 1 needs a MoE model")
        if problems:
            raise ValueError("parallel layout does not fit the model: " + "; ".join(problems))

    def ranks(self) -> list[tuple[int, int, int]]:
        return [(p, t, e) for p in range(self.pp) for t in range(self.tp) for e in range(self.ep)]


def _split_glu(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    gate, up = t.chunk(2, dim=0)
    return [torch.cat([g, u]) for g, u in zip(gate.chunk(n, dim=0), up.chunk(n, dim=0))]


def _merge_glu(parts: list[torch.Tensor]) -> torch.Tensor:
    halves = [p.chunk(2, dim=0) for p in parts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves])


_LAYER = re.compile(r"decoder\.layers\.(\d+)\.(.+)")
_COL = ("self_attention.linear_qkv.weight",)
_ROW = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_EXPERT = re.compile(r"mlp\.experts\.(.+)")


def _tp_split_dense(rest: str, t: torch.Tensor, tp: int) -> list[torch.Tensor]:
    if tp == 1:
        return [t]
    if rest in _COL:
        return list(t.chunk(tp, dim=0))
    if rest == "mlp.linear_fc1.weight":
        return _split_glu(t, tp)
    if rest in _ROW:
        return list(t.chunk(tp, dim=1))
    return [t] * tp  # norms, router: replicated


def _tp_merge_dense(rest: str, parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0]
    if rest in _COL:
        return torch.cat(parts, dim=0)
    if rest == "mlp.linear_fc1.weight":
        return _merge_glu(parts)
    if rest in _ROW:
        return torch.cat(parts, dim=1)
    return parts[0]


def shard(mg: dict[str, torch.Tensor], L: QwenLayout, par: Parallel) -> dict[tuple[int, int, int], dict[str, torch.Tensor]]:
    """Full Megatron state -> {(pp_rank, tp_rank, ep_rank): that rank's GPTModel state dict (local names)}."""
    par.check(L)
    per_stage = L.num_layers // par.pp
    etp = par.expert_tp
    local_experts = L.num_experts // par.ep if L.num_experts else 0
    out: dict[tuple[int, int, int], dict[str, torch.Tensor]] = {r: {} for r in par.ranks()}

    def put(pp, name, parts):  # parts indexed by tp rank, same for every ep rank
        for t in range(par.tp):
            for e in range(par.ep):
                out[(pp, t, e)][name] = parts[t]

    put(0, "embedding.word_embeddings.weight", list(mg["embedding.word_embeddings.weight"].chunk(par.tp, dim=0)))
    last = par.pp - 1
    put(last, "decoder.final_layernorm.weight", [mg["decoder.final_layernorm.weight"]] * par.tp)
    if not L.tie_embeddings:
        put(last, "output_layer.weight", list(mg["output_layer.weight"].chunk(par.tp, dim=0)))
    elif par.pp > 1:  # tied weights: the last stage keeps its own copy of the embedding as the output layer
        put(last, "output_layer.weight", list(mg["embedding.word_embeddings.weight"].chunk(par.tp, dim=0)))
    for i in range(L.num_layers):
        stage, local = divmod(i, per_stage)
        p = f"decoder.layers.{i}."
        lp = f"decoder.layers.{local}."
        if L.is_moe(i):
            fc1, fc2 = unpack_experts(mg, L, p, L.num_experts)
            for e_rank in range(par.ep):
                mine = range(e_rank * local_experts, (e_rank + 1) * local_experts)
                for t in range(par.tp):
                    et = t % etp if etp > 1 else 0
                    f1 = [_split_glu(fc1[x], etp)[et] if etp > 1 else fc1[x] for x in mine]
                    f2 = [fc2[x].chunk(etp, dim=1)[et] if etp > 1 else fc2[x] for x in mine]
                    out[(stage, t, e_rank)].update(pack_experts(f1, f2, L, lp))
        for name, tensor in mg.items():
            m = _LAYER.fullmatch(name)
            if not m or int(m.group(1)) != i or _EXPERT.fullmatch(m.group(2)):
                continue
            put(stage, lp + m.group(2), _tp_split_dense(m.group(2), tensor, par.tp))
    return out


def merge(shards: dict[tuple[int, int, int], dict[str, torch.Tensor]], L: QwenLayout, par: Parallel) -> dict[str, torch.Tensor]:
    """Inverse of `shard`: per-rank GPTModel state dicts -> one full Megatron state dict."""
    par.check(L)
    missing = [r for r in par.ranks() if r not in shards]
    if missing:
        raise ValueError(f"missing shards for ranks (pp, tp, ep) {missing}")
    per_stage = L.num_layers // par.pp
    etp = par.expert_tp
    local_experts = L.num_experts // par.ep if L.num_experts else 0
    last = par.pp - 1
    out = {
        "embedding.word_embeddings.weight": torch.cat([shards[(0, t, 0)]["embedding.word_embeddings.weight"]
                                                       for t in range(par.tp)]),
        "decoder.final_layernorm.weight": shards[(last, 0, 0)]["decoder.final_layernorm.weight"],
    }
    if not L.tie_embeddings:
        out["output_layer.weight"] = torch.cat([shards[(last, t, 0)]["output_layer.weight"] for t in range(par.tp)])
    for i in range(L.num_layers):
        stage, local = divmod(i, per_stage)
        p, lp = f"decoder.layers.{i}.", f"decoder.layers.{local}."
        base = shards[(stage, 0, 0)]
        for name in base:
            if not name.startswith(lp):
                continue
            rest = name[len(lp):]
            if _EXPERT.fullmatch(rest):
                continue
            out[p + rest] = _tp_merge_dense(rest, [shards[(stage, t, 0)][name] for t in range(par.tp)])
        if L.is_moe(i):
            fc1: list[torch.Tensor] = []
            fc2: list[torch.Tensor] = []
            for e_rank in range(par.ep):
                per_t = [unpack_experts(shards[(stage, t, e_rank)], L, lp, local_experts) for t in range(etp)]
                for x in range(local_experts):
                    fc1.append(_merge_glu([per_t[t][0][x] for t in range(etp)]) if etp > 1 else per_t[0][0][x])
                    fc2.append(torch.cat([per_t[t][1][x] for t in range(etp)], dim=1) if etp > 1 else per_t[0][1][x])
            out.update(pack_experts(fc1, fc2, L, p))
    return out


def hf_to_megatron_shards(hf: dict[str, torch.Tensor], L: QwenLayout, par: Parallel):
    return shard(hf_to_megatron(hf, L), L, par)


def megatron_shards_to_hf(shards, L: QwenLayout, par: Parallel) -> dict[str, torch.Tensor]:
    return megatron_to_hf(merge(shards, L, par), L)


_EXPERT_HF = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


@torch.no_grad()
def copy_hf_into_model(model, named: dict[str, torch.Tensor]) -> int:
    """Copy checkpoint-named tensors (any subset: one DCS bucket) into a transformers model in place.

    Per-expert names land in the fused expert tensors; `lm_head.weight` of a tied model lands in the embedding.
    Returns the number of tensors copied; an unknown name or a wrong shape raises naming the tensor."""
    params = dict(model.named_parameters(remove_duplicate=False))
    n = 0
    for name, t in named.items():
        target = params.get(name)
        if target is None and (m := _EXPERT_HF.fullmatch(name)):
            e, kind = int(m.group(2)), m.group(3)
            fused = params.get(f"{m.group(1)}.{'down_proj' if kind == 'down_proj' else 'gate_up_proj'}")
            if fused is not None:
                if kind == "down_proj":
                    target = fused[e]
                else:
                    f = fused.shape[1] // 2
                    target = fused[e, :f] if kind == "gate_proj" else fused[e, f:]
        if target is None:
            raise KeyError(f"weight {name!r} does not exist in this model")
        if tuple(target.shape) != tuple(t.shape):
            raise ValueError(f"weight {name!r}: shape {tuple(t.shape)} does not match the model's {tuple(target.shape)}")
        target.copy_(t)
        n += 1
    return n
