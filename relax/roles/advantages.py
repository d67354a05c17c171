"""Advantages: turns whole groups of rewards into per-token advantages with the configured estimator."""

from __future__ import annotations

import ray

from relax.algorithms import AdvantageInput, filter_groups, get_advantage, kl_reward
from relax.roles.teacher import opd_inputs
from relax.roles.base import Role
from relax.trainers import pad_right


@ray.remote
class AdvantagesRole(Role):
    name = "advantages"
    task = "advantages"
    fields = ["rewards", "group_id", "response_ids"]
    outputs = ["advantages"]
    whole_groups = True  # group baselines need every member of the group

    # Optional inputs/outputs: critic values + returns (gae), teacher log-probs (opd), DAPO keep mask.
    @classmethod
    def reads(cls, cfg) -> list[str]:
        alg = cfg.algorithm
        fields = cls.fields + ["values"] * (alg.advantage == "gae") + \
            ["rollout_log_probs", "teacher_log_probs"] * (alg.policy_loss == "opd") + \
            ["baseline_rewards"] * (alg.advantage == "remax")
        if alg.kl_in_reward:  # KL as a reward penalty: the Reference's log-probs join the token rewards
            fields += [f for f in ("rollout_log_probs", "ref_log_probs") if f not in fields]
        return fields

    @classmethod
    def writes(cls, cfg) -> list[str]:
        alg = cfg.algorithm
        return cls.outputs + ["returns"] * (alg.advantage == "gae") + ["keep"] * alg.dynamic_sampling.enabled

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        self.estimator = get_advantage(cfg.algorithm.advantage)

    def compute(self, batch):
        lengths = [len(r) for r in batch["response_ids"]]
        mask = pad_right([r.new_ones(len(r)).float() for r in batch["response_ids"]], dtype=None)
        rewards, token_rewards, alg = batch["rewards"].float(), None, self.cfg.algorithm
        values = pad_right([v.float() for v in batch["values"]], dtype=None) if "values" in self.fields else None
        if "teacher_log_probs" in self.fields:  # OPD: -coef (logp_student - logp_teacher) per token
            rewards, token_rewards, alg = opd_inputs(batch, self.cfg, mask)
        if "ref_log_probs" in self.fields:  # -kl_coef * KL(rollout || reference) per token
            lps = [pad_right([x.float() for x in batch[f]], dtype=None)[:, :mask.shape[1]]
                   for f in ("rollout_log_probs", "ref_log_probs")]
            kl = kl_reward(*lps, mask, alg.kl_coef, alg.kl_estimator)
            token_rewards = kl if token_rewards is None else token_rewards + kl
        baseline = batch["baseline_rewards"].float() if "baseline_rewards" in self.fields else None  # ReMax
        inp = AdvantageInput(rewards=rewards, group_index=batch["group_id"], response_mask=mask, values=values,
                             token_rewards=token_rewards, baseline_rewards=baseline)
        adv, ret = self.estimator(inp, alg)
        out = {"advantages": [adv[i, :n].clone() for i, n in enumerate(lengths)]}
        if values is not None:  # the critic's targets
            out["returns"] = [ret[i, :n].clone() for i, n in enumerate(lengths)]
        if "keep" in self.outputs:  # DAPO: groups with all-equal rewards are marked; the Actor skips them
            out["keep"] = filter_groups(batch["rewards"].float(), batch["group_id"]).long()
        return out
