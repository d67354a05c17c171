"""Supervised warm-up: a short SFT on the task's (prompt, answer) pairs so a tiny model starts RL with signal.

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
from tqdm import tqdm

from relax.config import ExperimentConfig
from relax.models import build_model, state_dict_cpu
from relax.tasks import make_task, supervised_pairs
from relax.trainers import pack, token_log_probs


def cache_root() -> Path:
    return Path(os.environ.get("RELAX_CACHE", Path.home() / ".cache" / "relax"))


def warmup_key(cfg: ExperimentConfig) -> str:
    task = cfg.task.model_dump(mode="json", exclude={"rl_pool", "eval_size"})  # RL-only knobs
    blob = json.dumps({"model": cfg.model.model_dump(mode="json"), "task": task,
                       "warmup": cfg.warmup.model_dump(mode="json"), "seed": cfg.seed}, sort_keys=True)
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


def _noisy(target: str, rng: random.Random) -> str:
    """A plausible wrong answer (keeps the format, changes the number)."""
    try:
        return f" {int(target) + rng.choice([-2, -1, 1, 2])}"
    except ValueError:
        return target


def sft(model, tok, cfg: ExperimentConfig, progress: bool = True) -> list[float]:
    if cfg.task.kind != "text":  # media inputs or multi-turn episodes with a loss mask
        from relax.omni.train import sft as sft_omni_agent

        return sft_omni_agent(model, tok, cfg, progress)
    w = cfg.warmup
    rng = random.Random(cfg.seed)
    pairs = supervised_pairs(make_task(cfg.task, cfg.seed, "train"), w.steps * w.batch_size)

    def batches():
        for step in range(w.steps):
            prompts, targets = [], []
            for prompt, target in pairs[step * w.batch_size : (step + 1) * w.batch_size]:
                if w.label_noise and rng.random() < w.label_noise:
                    target = _noisy(target.strip(), rng)
                prompts.append(torch.tensor(tok.encode(prompt)))
                targets.append(torch.tensor(tok.encode(target, add_bos=False) + [tok.eos_token_id]))
            yield pack(prompts, targets, tok.pad_token_id), None

    return supervised_loop(model, w, batches(), "warm-up (SFT)", progress)


def supervised_loop(model, w, batches, desc: str, progress: bool) -> list[float]:
    """`w.steps` supervised steps over `batches` ((packed, media) pairs): AdamW with a 20-step linear warm-up
    then linear decay, on `w.threads` threads; returns the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / w.steps))
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(w.threads)
    try:
        return [sft_step(model, opt, sched, packed, media)
                for packed, media in tqdm(batches, total=w.steps, desc=desc, disable=not progress)]
    finally:
        torch.set_num_threads(threads)


def sft_step(model, opt, sched, packed, media=None) -> float:
    """One supervised step: mean NLL of the packed rows' masked (response) tokens, clipped at 1.0; returns the loss."""
    lp = token_log_probs(model, packed, 1.0, media)
    loss = -(lp * packed.mask).sum() / packed.mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())
