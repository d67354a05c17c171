"""Advantages: turns whole groups of rewards into per-token advantages with the configured estimator."""

from __future__ import annotations

import ray

from relax.algorithms import AdvantageInput, get_advantage
from relax.roles.base import Role
from relax.trainers import pad_right


@ray.remote
class AdvantagesRole(Role):
    name = "advantages"
    task = "advantages"
    fields = ["rewards", "group_id", "response_ids"]
    whole_groups = True  # group baselines need every member of the group

    def __init__(self, cfg, bus, telemetry, weights, threads):
        super().__init__(cfg, bus, telemetry, weights, threads)
        self.estimator = get_advantage(cfg.algorithm.advantage)

    def compute(self, batch):
        lengths = [len(r) for r in batch["response_ids"]]
        mask = pad_right([r.new_ones(len(r)).float() for r in batch["response_ids"]], dtype=None)
        inp = AdvantageInput(rewards=batch["rewards"].float(), group_index=batch["group_id"], response_mask=mask)
        adv, _ = self.estimator(inp, self.cfg.algorithm)
        return {"advantages": [adv[i, :n].clone() for i, n in enumerate(lengths)]}
