"""Supervised warm-up: a short SFT on the task's (prompt, answer) pairs so a tiny model starts RL with signal.

`sft` runs the supervised loop (relax/trainers/supervised.py) on the batches of the task's kind: text pairs
(`text_batches`, here), omni (relax/omni/train.py) or agent (relax/agent/train.py) batches.

The result is cached under the config's hash (model, task, warm-up, seed), so every run and every role
process of an experiment starts from the same weights without redoing the work.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import torch

from relax.config import ExperimentConfig
from relax.models import build_model, state_dict_cpu
from relax.tasks import make_task, supervised_pairs
from relax.trainers.batching import pack
from relax.trainers.supervised import noisy_answer, supervised_loop


def cache_root() -> Path:
    return Path(os.environ.get("RELAX_CACHE", Path.home() / ".cache" / "relax"))


def warmup_key(cfg: ExperimentConfig) -> str:
    # RL-only knobs; eval_size decides the train rows when they exclude the eval questions
    task = cfg.task.model_dump(mode="json", exclude={"rl_pool", "eval_every"} | (set() if cfg.task.exclude_eval_questions else {"eval_size"}))
    # A knob left at None is left out, so that adding an optional one keeps every cached warm-up valid.
    warmup = cfg.warmup.model_dump(mode="json", exclude_none=True)
    blob = json.dumps({"model": cfg.model.model_dump(mode="json"), "task": task,
                       "warmup": warmup, "seed": cfg.seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def warmup_state(cfg: ExperimentConfig, progress: bool = True) -> dict[str, torch.Tensor]:
    """The warm-started weights for this config, from the cache or trained now."""
    path = cache_root() / "warmup" / f"{cfg.model.kind}-{warmup_key(cfg)}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    model, tok = build_model(cfg.model, cfg.seed)
    if cfg.warmup.steps > 0:
        sft(model, tok, cfg, progress)
    state = state_dict_cpu(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: concurrent runs never read half a file
    return state


def sft(model, tok, cfg: ExperimentConfig, progress: bool = True) -> list[float]:
    """The warm-up of `model` on the batches its task kind supplies (text pairs here; media inputs or multi-turn
    episodes with a loss mask from relax/omni/train.py, relax/agent/train.py); returns the losses."""
    kind = cfg.task.kind
    if kind == "omni":
        from relax.omni.train import warmup_batches
    elif kind == "agent":
        from relax.agent.train import warmup_batches
    else:
        warmup_batches = text_batches
    desc = "warm-up (SFT)" if kind == "text" else f"warm-up (SFT, {kind})"
    return supervised_loop(model, cfg.warmup, warmup_batches(tok, cfg), desc, progress)


def text_batches(tok, cfg: ExperimentConfig):
    """`cfg.warmup.steps` packed batches of the task's (prompt, answer) pairs in order, a `warmup.label_noise`
    share of the answers made wrong."""
    w = cfg.warmup
    rng = random.Random(cfg.seed)
    pairs = supervised_pairs(make_task(cfg.task, cfg.seed, "train"), w.steps * w.batch_size)

    def batches():
        for step in range(w.steps):
            prompts, targets = [], []
            for prompt, target in pairs[step * w.batch_size : (step + 1) * w.batch_size]:
                if w.label_noise and rng.random() < w.label_noise:
                    target = noisy_answer(target.strip(), rng, w.label_noise_offsets)
                prompts.append(torch.tensor(tok.encode(prompt)))
                targets.append(torch.tensor(tok.encode(target, add_bos=False) + [tok.eos_token_id]))
            yield pack(prompts, targets, tok.pad_token_id), None

    return batches()
