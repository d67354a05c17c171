"""The CPU trainer: log-prob recompute and policy-gradient updates over a transformers causal LM.

Sequences are packed as prompt + response, right-padded (causal attention makes trailing pads inert).
A training step is a stream of micro-batches (gradients accumulate) followed by one optimizer step; the
loss of each micro-batch is scaled by the whole step's token/sequence counts so accumulation is exact.
A micro-batch carrying `rollout_routed_experts` (R3, relax/moe/) is run with the rollout's expert choices
replayed in every MoE layer, in the training forward and in the log-prob forwards alike.
`training.precision` bf16 runs the forwards' matmuls in bf16 under torch.autocast (fp32 master weights, optimizer,
log-softmax and loss), as a bf16 GPU trainer does; fp32 (default) runs everything in fp32.
A micro-batch carrying `loss_mask` (multi-turn agent trajectories, relax/agent/) trains and scores only the
tokens the mask marks (the model's own; tool and environment tokens are 0); one carrying media feature fields
(`image_patches`, `audio_mel`, `video_frames`, relax/omni/) hands them to the model's forward as `media=`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from relax.algorithms import LossScale, aggregate, check_config, get_policy_loss, kl_penalty
from relax.config import ExperimentConfig
from relax.moe.replay import replay_from_batch

MEDIA_FIELDS = ("image_patches", "audio_mel", "video_frames")  # relax/omni/processor.py FIELDS


def media_rows(rows: dict, sl: slice = slice(None)) -> list[dict] | None:
    """Per-row media dicts of `rows[sl]` for a model's `media=` argument (None when no media field is present)."""
    names = [f for f in MEDIA_FIELDS if f in rows]
    if not names:
        return None
    n = len(rows[names[0]][sl])
    return [{f: rows[f][sl][i] for f in names} for i in range(n)]


@dataclass
class Packed:
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    resp_pos: torch.Tensor  # [B, T] positions of the logits that predict each response token
    resp_ids: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float, 1 on real response tokens


def pad_right(seqs: list[torch.Tensor], value: float = 0.0, dtype=None) -> torch.Tensor:
    T = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), max(T, 1)), value, dtype=dtype or seqs[0].dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def pack(prompts: list[torch.Tensor], responses: list[torch.Tensor], pad_id: int,
         loss_masks: list[torch.Tensor] | None = None) -> Packed:
    """Right-padded prompt + response rows; `mask` is 1 on response tokens, or `loss_masks[i]` where given."""
    B = len(prompts)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    T = max(max(len(r) for r in responses), 1)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    rid = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n, m = len(p), len(r)
        ids[i, :n] = p
        ids[i, n : n + m] = r
        attn[i, : n + m] = 1
        pos[i, :m] = torch.arange(n - 1, n + m - 1)
        rid[i, :m] = r
        if loss_masks is None:
            mask[i, :m] = 1.0
        else:
            if len(loss_masks[i]) != m:
                raise ValueError(f"row {i}: loss_mask has {len(loss_masks[i])} entries for {m} response tokens")
            mask[i, :m] = torch.as_tensor(loss_masks[i], dtype=torch.float32)
    return Packed(ids, attn, pos, rid, mask)


def compute_precision(model, precision: str = "fp32"):
    """The context a forward of `model` runs in for `training.precision`: fp32 -> none; bf16 -> torch.autocast
    to bf16 on the model's device (matmuls in bf16 from the fp32 weights; autocast keeps softmax, norms and the
    residual additions of fp32 tensors in fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)
    raise ValueError(f"training.precision: {precision!r} (fp32 or bf16)")


def token_log_probs(model, packed: Packed, temperature: float, media: list[dict] | None = None,
                    precision: str = "fp32") -> torch.Tensor:
    """log pi(response token | prefix) under softmax(logits / T), [B, T], zero on padding and masked tokens.
    `media`: per-row feature dicts for a model with media encoders (relax/omni/model.py). `precision`: the
    forward's compute precision (`compute_precision`); the log-softmax is always fp32."""
    kw = {} if media is None else {"media": media}
    with compute_precision(model, precision):
        logits = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask, **kw).logits
    idx = packed.resp_pos[..., None].expand(-1, -1, logits.size(-1))
    picked = logits.gather(1, idx).float() / temperature
    lp = torch.log_softmax(picked, dim=-1).gather(-1, packed.resp_ids[..., None]).squeeze(-1)
    return lp * packed.mask


def build_trainer(cfg: ExperimentConfig, model, pad_id: int, role: str = "actor"):
    """training.trainer: torch (this module) or megatron (relax/trainers/megatron/trainer.py, same interface:
    log_probs, accumulate, divide_grads, step, sync_hf)."""
    if cfg.training.trainer == "megatron":
        from relax.trainers.megatron.trainer import build_megatron_trainer

        return build_megatron_trainer(cfg, model, pad_id, role)
    return TorchTrainer(model, pad_id, cfg)


class TorchTrainer:
    def __init__(self, model, pad_id: int, cfg: ExperimentConfig):
        self.model = model.float().train()
        self.pad_id = pad_id
        self.cfg = cfg
        t = cfg.training
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
        check_config(cfg.algorithm)  # a misspelt algorithm.params key fails now, not silently later
        self.loss_fn = get_policy_loss(cfg.algorithm.policy_loss)
        self.temperature = cfg.rollout.temperature
        self.precision = t.precision  # master weights and optimizer stay fp32 either way

    def describe(self) -> str:
        return "torch (transformers model)"

    def optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        self.opt.load_state_dict(state)

    def log_probs(self, prompts: list[torch.Tensor], responses: list[torch.Tensor], token_budget: int,
                  routing: dict | None = None, inputs: dict | None = None) -> list[torch.Tensor]:
        return compute_log_probs(self.model, self.pad_id, prompts, responses, self.temperature, token_budget,
                                 routing, inputs, self.precision)

    def accumulate(self, mb: dict, scale: LossScale) -> dict[str, float]:
        """Forward + backward of one micro-batch; gradients accumulate until `step()`."""
        packed = pack(mb["prompt_ids"], mb["response_ids"], self.pad_id, mb.get("loss_mask"))
        with replay_from_batch(self.model, mb, packed.input_ids.shape[1]):
            logp = token_log_probs(self.model, packed, self.temperature, media_rows(mb), self.precision)
        old = pad_right(mb["old_log_probs"], dtype=torch.float32)
        adv = pad_right(mb["advantages"], dtype=torch.float32)
        rollout_lp = pad_right(mb["rollout_log_probs"], dtype=torch.float32) if "rollout_log_probs" in mb else None
        loss, metrics = self.loss_fn(logp, old, adv, packed.mask, self.cfg.algorithm, loss_scale=scale,
                                     rollout_log_probs=rollout_lp)
        if rollout_lp is not None:
            metrics.update(logp_gap(logp.detach(), rollout_lp, packed.mask))
        a = self.cfg.algorithm
        if a.kl_coef > 0 and "ref_log_probs" in mb:
            kl = kl_penalty(logp, pad_right(mb["ref_log_probs"], dtype=torch.float32), a.kl_estimator)
            kl_loss = aggregate(kl, packed.mask, a.loss_agg, scale)
            loss = loss + a.kl_coef * kl_loss
            metrics["kl"] = float((kl.detach() * packed.mask).sum() / packed.mask.sum().clamp(min=1))
        loss.backward()
        metrics["loss"] = float(loss.detach())
        return metrics

    def divide_grads(self, denom: float) -> None:
        """Divide the accumulated gradients by the step's loss denominator (applied once, after accumulation)."""
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(denom)

    def sync_hf(self, model) -> int:
        """The trained model is the transformers model itself: nothing to copy."""
        return 0

    def step(self) -> dict[str, float]:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"grad_norm": float(grad_norm)}


def logp_gap(logp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Trainer vs rollout engine on the rollout's tokens: mean |delta log-prob| and the k3 estimate of
    KL(engine || trainer) (the tokens are samples of the engine's distribution)."""
    n = mask.sum().clamp(min=1)
    r = (logp - rollout_lp) * mask
    kl = (r.clamp(max=30).exp() - 1 - r) * mask
    return {"logp_gap_abs": float(r.abs().sum() / n), "logp_gap_kl": float(kl.sum() / n)}


@torch.no_grad()
def compute_log_probs(model, pad_id: int, prompts: list[torch.Tensor], responses: list[torch.Tensor],
                      temperature: float, token_budget: int, routing: dict | None = None,
                      inputs: dict | None = None, precision: str = "fp32") -> list[torch.Tensor]:
    """Per-token log-probs of each response (no grad), micro-batched by token budget. `routing`: the rows'
    R3 fields (`rollout_routed_experts`, ...) to replay, or None. `inputs`: the rows' `loss_mask` and media
    fields (log-probs are 0 where the mask is 0), or None. `precision`: training.precision of the forward."""
    inputs = inputs or {}
    was_training = model.training
    model.eval()
    out: list[torch.Tensor] = []
    for lo, hi in budget_slices([len(p) + len(r) for p, r in zip(prompts, responses)], token_budget):
        masks = inputs["loss_mask"][lo:hi] if "loss_mask" in inputs else None
        packed = pack(prompts[lo:hi], responses[lo:hi], pad_id, masks)
        rows = {"prompt_ids": prompts, "response_ids": responses, **(routing or {})}
        with replay_from_batch(model, rows, packed.input_ids.shape[1], slice(lo, hi)):
            lp = token_log_probs(model, packed, temperature, media_rows(inputs, slice(lo, hi)), precision)
        out.extend(lp[i, : len(r)].clone() for i, r in enumerate(responses[lo:hi]))
    model.train(was_training)
    return out


def budget_slices(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) slices whose padded size (rows x longest row) stays within `budget` tokens."""
    out, lo, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest_next = max(longest, n)
        if i > lo and longest_next * (i - lo + 1) > budget:
            out.append((lo, i))
            lo, longest_next = i, n
        longest = longest_next
    if lo < len(lengths):
        out.append((lo, len(lengths)))
    return out
