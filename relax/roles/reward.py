"""Reward: grades each response with the task's rule-based scorer and writes the `rewards` field."""

from __future__ import annotations

import ray
import torch

from relax.roles.base import Role
from relax.tasks import make_task


@ray.remote
class RewardRole(Role):
    name = "reward"
    task = "reward"
    fields = ["prompt_index", "response_ids"]
    outputs = ["rewards"]

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.task.reward != "genrm"  # the GenRM role writes `rewards` instead

    @classmethod
    def reads(cls, cfg) -> list[str]:
        # Text fields only, whatever the task carries (omni rows hold media fields this role never fetches);
        # agent episodes: the loss mask picks the model's own tokens (a tool's reply cannot answer for it).
        return cls.fields + ["loss_mask"] * (cfg.task.kind == "agent")

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        from relax.models import build_tokenizer

        self.data = make_task(cfg.task, cfg.seed, "train")
        self.tokenizer = build_tokenizer(cfg.model)

    def compute(self, batch):
        scores = []
        masks = batch["loss_mask"] if "loss_mask" in self.fields else [None] * batch.size
        for idx, resp, mask in zip(batch["prompt_index"].tolist(), batch["response_ids"], masks):
            text = self.tokenizer.decode(resp if mask is None else resp[mask.bool()])
            scores.append(float(self.data.score(self.data[idx], text)))
        return {"rewards": torch.tensor(scores, dtype=torch.float32)}
