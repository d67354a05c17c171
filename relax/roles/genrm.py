"""GenRM: the generative reward model served as its own role (`task.reward: genrm`, replaces Reward).

Builds the judge from `genrm.model` (a causal LM from config: tiny_qwen3 random-init + nothing, smollm2, or
a local HF folder), fills `genrm.template` with each row's question / response / reference answer, and
writes `rewards` (the parsed score) and `reward_error` (0 ok, 1 judge failed or unparsable, 2 timed out;
relax/rewards/genrm.py) on every row. `genrm.timeout_s` bounds each batch; a failed or timed-out row
scores 0 and the run goes on.
"""

from __future__ import annotations

import logging

import ray
import torch

from relax.rewards.genrm import ERR_OK, GenRMJudge
from relax.roles.base import Role
from relax.tasks import make_task

log = logging.getLogger(__name__)


def build_judge(cfg) -> GenRMJudge:
    from relax.models import build_model

    model, tok = build_model(cfg.genrm.model, cfg.seed)
    return GenRMJudge(model, tok, cfg.genrm.template, cfg.genrm.max_new_tokens)


@ray.remote
class GenRMRole(Role):
    name = "genrm"
    task = "reward"
    fields = ["prompt_index", "response_ids"]
    outputs = ["rewards", "reward_error"]

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.task.reward == "genrm"

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        from relax.models import build_tokenizer

        self.data = make_task(cfg.task, cfg.seed, "train")
        self.tokenizer = build_tokenizer(cfg.model)  # the policy's, to read responses
        self.judge = build_judge(cfg)
        self.errors = 0

    def compute(self, batch):
        rows = []
        for idx, resp in zip(batch["prompt_index"].tolist(), batch["response_ids"]):
            p = self.data[idx]
            rows.append((p.question, self.tokenizer.decode(resp), p.answer))
        judged = self.judge.score(rows, self.cfg.genrm.timeout_s)
        bad = [j.message for j in judged if j.error != ERR_OK]
        if bad:
            self.errors += len(bad)
            log.warning("genrm: %d of %d rows marked (%s)", len(bad), len(judged), bad[0])
        return {"rewards": torch.tensor([j.score for j in judged], dtype=torch.float32),
                "reward_error": torch.tensor([j.error for j in judged], dtype=torch.long)}

    def error_count(self) -> int:
        return self.errors
