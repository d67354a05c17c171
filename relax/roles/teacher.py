"""Teacher: scores the student's sampled tokens for on-policy distillation (`algorithm.policy_loss: opd`).

The teacher is a model built from config: `teacher.model` (None: the policy's own architecture) with the
supervised warm-up run for `teacher.warmup_steps` (None: 3 x `warmup.steps`), i.e. at CPU scale the warm-up
trained longer, cached like every warm-up. It must share the student's tokenizer (it scores the student's
token ids). For every row it writes `teacher_log_probs` = log pi_teacher(y_t | prefix) at the rollout
temperature.

Advantages then adds the per-token term -opd_coef * (log pi_student(y_t) - log pi_teacher(y_t)) (the
rollout's own log-probs are the student's, sampled on-policy) through `AdvantageInput.token_rewards`, with
gamma 0 unless `algorithm.params.gamma` says otherwise (each token's own reverse-KL sample, no reward-to-go),
and drops the task reward when `algorithm.params.task_reward` is false (pure distillation).
"""

from __future__ import annotations

import ray
import torch

from relax.roles.base import Role
from relax.trainers import compute_log_probs, pad_right

OPD_DEFAULTS = {"opd_coef": 1.0, "task_reward": True}


def teacher_config(cfg):
    """The ExperimentConfig whose warm-up gives the teacher's weights."""
    t = cfg.teacher
    model = t.model or cfg.model
    if model.tokenizer != cfg.model.tokenizer:
        raise ValueError("teacher.model must use the policy's tokenizer (it scores the student's token ids)")
    steps = t.warmup_steps if t.warmup_steps is not None else 3 * cfg.warmup.steps
    return cfg.model_copy(update={"model": model, "warmup": cfg.warmup.model_copy(update={"steps": steps})})


def build_teacher(cfg):
    """(model, tokenizer) of the teacher, weights from its (cached) warm-up."""
    from relax.models import build_model
    from relax.models.warmup import warmup_state

    tcfg = teacher_config(cfg)
    model, tok = build_model(tcfg.model, cfg.seed)
    model.load_state_dict(warmup_state(tcfg, progress=False), strict=False)
    return model.eval(), tok


def opd_inputs(batch, cfg, mask: torch.Tensor):
    """(rewards [B], token_rewards [B, T], algorithm config) for the advantage estimator under OPD."""
    alg = cfg.algorithm
    from relax.algorithms import opd_token_advantage

    p = {key: alg.params.get(key, d) for key, d in OPD_DEFAULTS.items()}
    T = mask.shape[1]
    student = pad_right([x.float() for x in batch["rollout_log_probs"]], dtype=torch.float32)[:, :T]
    teacher = pad_right([x.float() for x in batch["teacher_log_probs"]], dtype=torch.float32)[:, :T]
    token_rewards = opd_token_advantage(student, teacher, float(p["opd_coef"])) * mask
    rewards = batch["rewards"].float()
    if not p["task_reward"]:
        rewards = torch.zeros_like(rewards)
    if "gamma" not in alg.params:  # per-token reverse KL, no reward-to-go
        alg = alg.model_copy(update={"params": {**alg.params, "gamma": 0.0}})
    return rewards, token_rewards, alg


@ray.remote
class TeacherRole(Role):
    name = "teacher"
    task = "teacher_log_probs"
    fields = ["prompt_ids", "response_ids"]
    outputs = ["teacher_log_probs"]

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.algorithm.policy_loss == "opd"

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        self.model, self.tokenizer = build_teacher(cfg)

    def compute(self, batch):
        lps = compute_log_probs(self.model, self.tokenizer.pad_token_id, batch["prompt_ids"], batch["response_ids"],
                                self.cfg.rollout.temperature, self.cfg.training.micro_batch_tokens)
        return {"teacher_log_probs": lps}
