"""Reference: log-prob forward of the frozen reference policy (the warm-up weights) for the KL term."""

from __future__ import annotations

import ray

from relax.roles.base import ModelRole
from relax.trainers import compute_log_probs


@ray.remote
class ReferenceRole(ModelRole):
    name = "reference"
    task = "ref_log_probs"
    fields = ["prompt_ids", "response_ids"]

    def __init__(self, cfg, bus, telemetry, weights, threads):
        super().__init__(cfg, bus, telemetry, weights, threads)
        self.sync_weights(min_version=0)  # the reference is version 0 and never moves

    def compute(self, batch):
        lps = compute_log_probs(self.model, self.tokenizer.pad_token_id, batch["prompt_ids"], batch["response_ids"],
                                self.cfg.rollout.temperature, self.cfg.training.micro_batch_tokens)
        return {"ref_log_probs": lps}
