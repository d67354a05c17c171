"""Accuracy of a set of weights on the task's held-out split (before / after RL).

Greedy decoding measures the policy's mode; sampling at the rollout temperature measures the quantity RL
optimises (the expected reward), free of the prompt-to-prompt noise of per-step training rewards.
"""

from __future__ import annotations

from pathlib import Path

import torch

from relax.config import ExperimentConfig
from relax.engines import TorchEngine
from relax.models import build_model
from relax.tasks import make_task


def accuracy(cfg: ExperimentConfig, state: dict[str, torch.Tensor], temperature: float = 0.0,
             samples: int = 1, batch: int = 64) -> float:
    """Mean reward over the eval split, `samples` responses per prompt (greedy when temperature is 0)."""
    if cfg.task.kind != "text":  # media inputs / multi-turn episodes: relax/omni/evaluate.py
        from relax.omni.evaluate import accuracy as media_accuracy

        return media_accuracy(cfg, state, temperature, samples, batch)
    model, tok = build_model(cfg.model, cfg.seed)
    engine = TorchEngine(model, tok, dtype=cfg.rollout.dtype, temperature=temperature, top_p=cfg.rollout.top_p,
                         seed=cfg.seed)
    engine.update_weights(state, 0)
    data = make_task(cfg.task, cfg.seed, "eval")
    items = [data[i] for i in range(min(cfg.task.eval_size, len(data))) for _ in range(samples)]
    total = 0.0
    for lo in range(0, len(items), batch):
        chunk = items[lo : lo + batch]
        gens = engine.generate([tok.encode(p.prompt) for p in chunk], cfg.rollout.max_new_tokens)
        total += sum(float(data.score(p, tok.decode(g.token_ids))) for p, g in zip(chunk, gens))
    return total / max(len(items), 1)


def greedy_accuracy(cfg: ExperimentConfig, state: dict[str, torch.Tensor]) -> float:
    return accuracy(cfg, state, temperature=0.0)


def sampled_reward(cfg: ExperimentConfig, state: dict[str, torch.Tensor], samples: int = 4) -> float:
    return accuracy(cfg, state, temperature=cfg.rollout.temperature, samples=samples)


def eval_curve(cfg: ExperimentConfig, snapshots: dict[int, Path], rows: list[dict], start: float,
               end: float) -> list[dict]:
    """Held-out greedy accuracy against training: the warm-up start (`start`), each weight snapshot the run kept
    (`snapshots`: version -> file, RunFolder.snapshots) and the final weights (`end`). `version` N is the policy
    after N training steps; `wall_time_s` is when the step that made it ended (metrics.jsonl's clock)."""
    from safetensors.torch import load_file

    wall = {r["step"] + 1: r["wall_time_s"] for r in rows}
    points = [(0, start)]
    points += [(v, greedy_accuracy(cfg, load_file(str(path)))) for v, path in snapshots.items() if v < len(rows)]
    points.append((len(rows), end))
    return [{"version": v, "wall_time_s": wall.get(v, 0.0), "accuracy": round(a, 4)} for v, a in points]


def evaluate_run(run_dir, sampled: bool = False, eval_size: int | None = None) -> dict:
    """Held-out eval of a finished run: the warm-up start (`warmup_state` of its config) and its final weights
    (`final_weights.safetensors`), greedy (and, with `sampled`, at the rollout temperature), with the keys the
    controller writes into summary.json. For a run whose in-run eval was skipped or cut short."""
    from safetensors.torch import load_file

    from relax.config import load_config
    from relax.run_folder import CONFIG, FINAL_WEIGHTS
    from relax.models.warmup import warmup_state

    run_dir = Path(run_dir)
    cfg = load_config(run_dir / CONFIG, [f"task.eval_size={eval_size}"] if eval_size else [])
    start, final = warmup_state(cfg, progress=False), load_file(str(run_dir / FINAL_WEIGHTS))
    out = {"eval_size": cfg.task.eval_size, "eval_accuracy_start": greedy_accuracy(cfg, start),
           "eval_accuracy_end": greedy_accuracy(cfg, final)}
    if sampled:
        out.update(eval_reward_start=sampled_reward(cfg, start), eval_reward_end=sampled_reward(cfg, final))
    return out

