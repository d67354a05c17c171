"""Tasks: seeded, indexable prompt sets with their scorer.

`make_task(cfg, seed, split)` builds the train or eval split of `cfg.name`: `local_dataset` or `dapo_math`
(researchers' own jsonl / parquet / save_to_disk data, `relax.tasks.data_files`), `digit_sum` (omni,
relax/omni/task.py), `tool_arith` (agent, relax/agent/task.py) or any reasoning-gym dataset. `task[i]` is a `Prompt`; `task.score(prompt, text)`
grades a response with the reward named by `cfg.reward`. `supervised_pairs(task, n)` gives warm-up pairs.
"""

from __future__ import annotations

from typing import Literal

from relax.config import TaskConfig
from relax.tasks import data_files, gym
from relax.tasks.base import Task, supervised_pairs
from relax.tasks.prompt import Prompt

__all__ = ["Prompt", "Task", "make_task", "supervised_pairs"]

def _digit_sum(cfg, seed, split):  # omni (relax/omni/task.py): image + audio or video -> their digit sum
    from relax.omni.task import load

    return load(cfg, seed, split)


def _tool_arith(cfg, seed, split):  # agent (relax/agent/task.py): multiply with a calculator tool
    from relax.agent.task import load

    return load(cfg, seed, split)


_LOCAL = {"local_dataset": data_files.load, "dapo_math": data_files.load, "digit_sum": _digit_sum,
          "tool_arith": _tool_arith}


def make_task(cfg: TaskConfig, seed: int, split: Literal["train", "eval"]) -> Task:
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    local = _LOCAL.get(cfg.name)
    if local is not None and cfg.reward == "reasoning_gym":
        raise ValueError(f"task.reward: {cfg.name} is not a reasoning-gym task; use math_verify or exact")
    length, row = (local or gym.load)(cfg, seed, split)
    if split == "train" and cfg.exclude_eval_questions:
        eval_length, eval_row = (local or gym.load)(cfg, seed, "eval")
        held_out = {eval_row(i)[0] for i in range(eval_length)}
        keep = [i for i in range(length) if row(i)[0] not in held_out]
        if not keep:
            raise ValueError(f"task.exclude_eval_questions: every train question of {cfg.name} is in the eval "
                             f"split ({len(held_out)} distinct); lower task.eval_size")
        length, row = len(keep), (lambda i, base=row: base(keep[i]))
    return Task(cfg.name, cfg.prompt_template, cfg.reward, length, row)
