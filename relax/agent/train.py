"""Supervised warm-up batches of agent tasks (relax.models.warmup trains on them when `task.kind` is agent).

The intended episode (relax/agent/task.py `demo_turns`: a calculator call, its observation, the answer) as one
trajectory; loss on the model's tokens only (loss mask 0 on the observation). The loop itself is
relax/trainers/supervised.py.
"""

from __future__ import annotations

import torch

from relax.agent.task import demo_turns
from relax.agent.trajectory import Trajectory
from relax.tasks import make_task
from relax.trainers.supervised import sampled_batches


def agent_trajectory(tok, prompt) -> Trajectory:
    t = Trajectory(prompt_ids=tok.encode(prompt.prompt))
    turns = demo_turns(prompt.meta["a"], prompt.meta["b"], prompt.answer)
    for j, (kind, text) in enumerate(turns):
        ids = tok.encode(text, add_bos=False) + [tok.eos_token_id] * (j == len(turns) - 1)
        if kind == "model":
            t.add_model(ids, [0.0] * len(ids))
        else:
            t.add_observation(ids)
    return t


def agent_batch(tok, data, idx: list[int]) -> dict:
    trajs = [agent_trajectory(tok, data[i]) for i in idx]
    return {"prompt_ids": [torch.tensor(t.prompt_ids) for t in trajs],
            "response_ids": [torch.tensor(t.response_ids) for t in trajs],
            "loss_mask": [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs]}


def warmup_batches(tok, cfg):
    """`cfg.warmup.steps` packed batches (with loss masks) of train prompts drawn by `cfg.seed`."""
    data = make_task(cfg.task, cfg.seed, "train")
    return sampled_batches(lambda idx: agent_batch(tok, data, idx), len(data), cfg.warmup, cfg.seed,
                           tok.pad_token_id)


__all__ = ["agent_batch", "agent_trajectory", "warmup_batches"]
