"""Supervised warm-up for omni and agent tasks (relax.models.warmup calls `sft` when `task.kind` is not text).

Uses the trainer's own packing and log-prob forward (relax.trainers: `pack` with loss masks,
`token_log_probs` with media), so the warm-up and RL see the model through the same code.
  omni:  prompt = media placeholders + question text, target = the answer + EOS; the media fields go to
         the forward (the encoders and projectors learn here).
  agent: the intended episode (relax/agent/task.py `demo_turns`: a calculator call, its observation, the
         answer) as one trajectory; loss on the model's tokens only (loss mask 0 on the observation).
"""

from __future__ import annotations

import random

import torch

from relax.agent.trajectory import Trajectory
from relax.omni.processor import FIELDS, OmniProcessor
from relax.tasks import make_task
from relax.models.warmup import supervised_loop
from relax.trainers import pack
from relax.trainers.torch_trainer import media_rows


def omni_batch(proc: OmniProcessor, tok, data, idx: list[int]) -> dict:
    items = [data[i] for i in idx]
    rows = proc.rows([{"media": p.meta["media"], "text": p.prompt} for p in items])
    rows["response_ids"] = [torch.tensor(tok.encode(p.answer, add_bos=False) + [tok.eos_token_id]) for p in items]
    return rows


def agent_trajectory(tok, prompt) -> Trajectory:
    from relax.agent.task import demo_turns

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


def sft(model, tok, cfg, progress: bool = True) -> list[float]:
    w = cfg.warmup
    data = make_task(cfg.task, cfg.seed, "train")
    proc = OmniProcessor(tok) if cfg.task.kind == "omni" else None
    rng = random.Random(cfg.seed)

    def batches():
        for _ in range(w.steps):
            idx = [rng.randrange(len(data)) for _ in range(w.batch_size)]
            rows = omni_batch(proc, tok, data, idx) if proc is not None else agent_batch(tok, data, idx)
            yield pack(rows["prompt_ids"], rows["response_ids"], tok.pad_token_id, rows.get("loss_mask")), media_rows(rows)

    return supervised_loop(model, w, batches(), f"warm-up (SFT, {cfg.task.kind})", progress)


__all__ = ["FIELDS", "agent_batch", "agent_trajectory", "omni_batch", "sft"]
