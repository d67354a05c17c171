"""Reference: log-prob forward of the frozen reference policy (the warm-up weights) for the KL term."""

from __future__ import annotations

import ray

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

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        self.sync_weights(exact=0)  # the reference is version 0 and never moves (a restart gets it from a peer)
        self.boot.mark("weight_fetch")
        self.fields = self.fields + r3_fields(cfg)  # R3: the rollout's experts, replayed in the forward
        self.fields += input_fields(cfg)  # omni media / agent loss mask

    def compute(self, batch):
        lps = compute_log_probs(self.model, self.tokenizer.pad_token_id, batch["prompt_ids"], batch["response_ids"],
                                self.cfg.rollout.temperature, self.cfg.training.micro_batch_tokens,
                                {f: batch[f] for f in r3_fields(self.cfg)},
                                {f: batch[f] for f in input_fields(self.cfg)}, self.cfg.training.precision)
        return {"ref_log_probs": lps}
