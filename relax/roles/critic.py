"""Critic: a value model for PPO with GAE (started when `algorithm.advantage` is `gae`).

The value model is the policy architecture (warm-up weights) with a scalar value head on the last hidden
state: V_t = head(h at the position that predicts response token t), i.e. the value of the state before
token t. Per partition k the Critic
  1. writes `values` (its current estimate) on every row, which Advantages reads for GAE, then
  2. reads the `returns` Advantages wrote (A_t + V_t, before whitening) and takes one optimizer step on the
     clipped value loss  0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), token-mean, with
     V_old = the values it wrote in 1 and c = `critic.value_clip`.
Both phases consume rows through the bus (tasks `critic_values`, `critic_train`), so each row is seen
exactly once per phase. Async mode: `run` does 1 then 2 per partition, Advantages in between on its own
loop. Colocate mode: the colocate loop (relax/schedules/relax.py) calls `process_partition(k)` (1) before
Advantages and `train_partition(k)` (2) after it, before the Actor's step (the role's `phases`).
"""

from __future__ import annotations


import ray
import torch
from torch import nn

from relax.bus import WAIT_S
from relax.roles.base import Role
from relax.trainers import pad_right
from relax.trainers.batching import pack
from relax.trainers.budget import budget_slices

VALUE_CLIP = 0.2


class ValueModel(nn.Module):
    """A causal LM's decoder with a scalar head (zero-initialised: V = 0 at the start, as for GAE with lam=1)."""

    def __init__(self, lm):
        super().__init__()
        self.decoder = lm.get_decoder()
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompts: list[torch.Tensor], responses: list[torch.Tensor], pad_id: int) -> torch.Tensor:
        """[B, T] values of each response token's state, zero on padding."""
        packed = pack(prompts, responses, pad_id)
        h = self.decoder(input_ids=packed.input_ids, attention_mask=packed.attention_mask).last_hidden_state
        idx = packed.resp_pos[..., None].expand(-1, -1, h.size(-1))
        return self.head(h.gather(1, idx).float()).squeeze(-1) * packed.mask


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip: float = VALUE_CLIP) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, token-mean over `mask`: 0.5 * max((V - R)^2, (V_clip - R)^2)."""
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    per_tok = 0.5 * torch.maximum((values - returns).square(), (v_clip - returns).square())
    n = mask.sum().clamp(min=1)
    loss = (per_tok * mask).sum() / n
    frac = (((values - returns).square() < (v_clip - returns).square()).float() * mask).sum() / n
    return loss, {"value_loss": float(loss.detach()), "value_clip_frac": float(frac)}


class Critic:
    """The value model and its optimizer (no Ray): what the role runs, and what the tests drive."""

    def __init__(self, lm, pad_id: int, lr: float, clip: float = VALUE_CLIP, token_budget: int = 4096,
                 grad_clip: float = 1.0):
        self.model = ValueModel(lm).float()
        self.pad_id = pad_id
        self.clip = clip
        self.budget = token_budget
        self.grad_clip = grad_clip
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)

    @torch.no_grad()
    def values(self, prompts, responses) -> list[torch.Tensor]:
        self.model.eval()
        out = []
        for lo, hi in budget_slices([len(p) + len(r) for p, r in zip(prompts, responses)], self.budget):
            v = self.model(prompts[lo:hi], responses[lo:hi], self.pad_id)
            out.extend(v[i, : len(r)].clone() for i, r in enumerate(responses[lo:hi]))
        return out

    def accumulate(self, prompts, responses, old_values, returns, weight: float) -> dict[str, float]:
        """Backward of `weight` x the clipped value loss of these rows (gradients accumulate until `step`)."""
        self.model.train()
        v = self.model(prompts, responses, self.pad_id)
        mask = pad_right([r.new_ones(len(r)).float() for r in responses], dtype=torch.float32)[:, : v.shape[1]]
        old = pad_right([x.float() for x in old_values], dtype=torch.float32)
        ret = pad_right([x.float() for x in returns], dtype=torch.float32)
        loss, metrics = clipped_value_loss(v, old, ret, mask, self.clip)
        (loss * weight).backward()
        return metrics

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(norm)

    def train_batch(self, prompts, responses, old_values, returns) -> dict[str, float]:
        """One optimizer step on a whole batch (token-mean weighted across micro-batches)."""
        tokens = sum(len(r) for r in responses)
        metrics = {}
        for lo, hi in budget_slices([len(p) + len(r) for p, r in zip(prompts, responses)], self.budget):
            w = sum(len(r) for r in responses[lo:hi]) / max(tokens, 1)
            metrics = self.accumulate(prompts[lo:hi], responses[lo:hi], old_values[lo:hi], returns[lo:hi], w)
        metrics["grad_norm"] = self.step()
        return metrics


def critic_lr(cfg) -> float:
    """The value head starts at zero and must catch up with the returns: 10 x the policy's learning rate."""
    return cfg.training.lr * 10


@ray.remote
class CriticRole(Role):
    name = "critic"
    task = "critic_values"
    fields = ["prompt_ids", "response_ids"]
    outputs = ["values"]
    TRAIN_FIELDS = ["prompt_ids", "response_ids", "values", "returns"]
    phases = ("process_partition", "train_partition")  # values before Advantages, the value step after it

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.algorithm.advantage == "gae"

    @classmethod
    def train_reads(cls, cfg) -> list[str]:
        return list(cls.TRAIN_FIELDS)  # the value step needs the returns Advantages writes

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        from relax.models import build_model

        lm, self.tokenizer = build_model(cfg.model, cfg.seed)
        # Start from the warm-up weights (version 0, pinned by the driver), like the Reference.
        self.weights.sync(-1, lambda state, version: lm.load_state_dict(state, strict=False), exact=0)
        self.critic = Critic(lm, self.tokenizer.pad_token_id, critic_lr(cfg),
                             token_budget=cfg.training.micro_batch_tokens, grad_clip=cfg.training.grad_clip)
        self.history: list[dict] = []

    def compute(self, batch):
        return {"values": self.critic.values(batch["prompt_ids"], batch["response_ids"])}

    def run(self, steps: int, start: int = 0, recover: bool = False) -> None:
        for k in range(start, steps):
            self.process_partition(k, recover)
            self.train_partition(k)
        self.rec.flush()

    def train_partition(self, k: int) -> dict:
        """One optimizer step on the returns of partition k, micro-batch by micro-batch as they arrive."""
        fields = self.TRAIN_FIELDS
        chunks = list(self._collect(k, fields))
        cols = {f: [x for c in chunks for x in c[f]] for f in fields}
        if not cols["returns"]:
            return {}
        with self.rec.span("critic_train", step=k, rows=len(cols["returns"])) as span_args:
            metrics = self.critic.train_batch(cols["prompt_ids"], cols["response_ids"], cols["values"], cols["returns"])
            span_args.update(metrics)  # value_loss, value_clip_frac, grad_norm in trace.json
        self.history.append({"step": k, **metrics})
        self.rec.flush()
        return metrics

    def _collect(self, k: int, fields: list[str]):
        done = 0
        while done < self.rows_per_step:
            batch = self.bus.fetch(k, "critic_train", fields, max_rows=self.rows_per_step - done, wait=WAIT_S)
            if batch is None:
                if k not in self.bus.held_rows():  # partition already trained and cleared: train on what we got
                    return
                continue
            done += batch.size
            yield {f: list(batch[f]) for f in fields}

    def train_history(self) -> list[dict]:
        return list(self.history)
