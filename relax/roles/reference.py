"""Reference: log-prob forward of the frozen reference policy (the warm-up weights) for the KL term.

With training.trainer megatron and the role given GPUs or `resources.reference.workers`, the forward runs on
Megatron-Core with `training.forward_parallel` (one process, or a worker group of that many ranks,
relax/trainers/megatron/group.py); otherwise on the transformers model in this process."""

from __future__ import annotations

import ray

from relax.config import megatron_forward
from relax.emulate import enabled, paced
from relax.moe.fields import r3_fields
from relax.omni.fields import input_fields
from relax.roles.base import ModelRole
from relax.trainers import compute_log_probs


@ray.remote
class ReferenceRole(ModelRole):
    name = "reference"
    task = "ref_log_probs"
    fields = ["prompt_ids", "response_ids"]
    outputs = ["ref_log_probs"]

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.algorithm.kl_coef > 0  # the KL term's reference

    @classmethod
    def reads(cls, cfg) -> list[str]:
        # R3: the rollout's experts, replayed in the forward; omni media / agent loss mask.
        # emulated GPUs: the sample ids price the forward (their modelled lengths, relax/emulate/)
        return cls.fields + r3_fields(cfg) + input_fields(cfg) + ["sample_id"] * enabled(cfg)

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        self.sync_weights(exact=0)  # the reference is version 0 and never moves (a restart gets it from a peer)
        self.boot.mark("weight_fetch")
        self.forward = None
        if megatron_forward(cfg, "reference"):
            from relax.trainers.factory import build_megatron_trainer

            self.forward = build_megatron_trainer(cfg, self.model, self.tokenizer.pad_token_id, "reference")
            self.boot.mark("megatron_forward")

    def backend(self) -> str:
        return self.forward.describe() + ", forward only" if self.forward is not None else super().backend()

    def compute(self, batch):
        with paced(self.cfg, "reference_forward",
                   lambda e: e.forward_time(batch["sample_id"].tolist(), "reference")):
            return self._compute(batch)

    def _compute(self, batch):
        if self.forward is not None:
            return {"ref_log_probs": self.forward.log_probs(batch["prompt_ids"], batch["response_ids"],
                                                            self.cfg.training.micro_batch_tokens)}
        lps = compute_log_probs(self.model, self.tokenizer.pad_token_id, batch["prompt_ids"], batch["response_ids"],
                                self.cfg.rollout.temperature, self.cfg.training.micro_batch_tokens,
                                {f: batch[f] for f in r3_fields(self.cfg)},
                                {f: batch[f] for f in input_fields(self.cfg)}, self.cfg.training.precision)
        return {"ref_log_probs": lps}
