"""The CPU trainer: log-prob recompute and policy-gradient updates over a transformers causal LM.

Sequences are packed as prompt + response, right-padded (causal attention makes trailing pads inert;
relax/trainers/batching.py).
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
import math

import torch

from relax.algorithms import LossScale, aggregate, check_config, get_policy_loss, kl_penalty
from relax.config import ExperimentConfig
from relax.moe.replay import replay_from_batch
from relax.trainers.batching import Packed, media_rows, pack, pad_right
from relax.trainers.budget import budget_slices


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

    def step(self, skip: bool = False) -> dict[str, float]:
        """Clip and take the optimizer step; with `skip` (the loss was not finite) or a non-finite gradient norm,
        drop the gradients instead: parameters and optimizer state stay as they were."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.training.grad_clip))
        skipped = skip or not math.isfinite(grad_norm)
        if not skipped:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"grad_norm": grad_norm, "skipped_nonfinite": int(skipped)}


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
