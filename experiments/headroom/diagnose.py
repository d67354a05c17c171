"""Why RL does or does not raise held-out accuracy: the warm-up start of a head-room config, measured in one process.

`python -m experiments.headroom.diagnose [--config experiments/headroom/cpu.yaml] [--groups 32] [key=value ...]`
prints, for the config's warm-up (cached by config hash, trained if missing):
- the question space: distinct train / eval questions and how many eval questions recur in training;
- greedy accuracy on the eval split (held out) and on as many train prompts (memorised vs generalised);
- the reward signal RL would see: `--groups` train prompts x group_size samples at the rollout temperature:
  the mean reward, the share of groups whose rewards are all equal (zero GRPO advantage: no gradient) and
  the mean within-group reward std; the same on the eval prompts (the head-room RL could sharpen into greedy);
- the mean sampled-token negative log-prob (an entropy estimate).
A diagnostic, not a benchmark: the numbers are on the warm-up start only (RL's own curve is the run's
metrics.jsonl: reward_mean, zero_adv_share, neg_logp_mean, kl, grad_norm, clip_frac).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from relax.config import load_config
from relax.engines import TorchEngine
from relax.models import build_model
from relax.models.warmup import warmup_state
from relax.tasks import make_task


def _questions(task, n: int) -> set[str]:
    return {task[i].question for i in range(min(n, len(task)))}


def group_stats(engine, tok, task, idx: list[int], group: int, max_new: int) -> dict:
    prompts = [task[i] for i in idx for _ in range(group)]
    gens = engine.generate([tok.encode(p.prompt) for p in prompts], max_new)
    rewards = [float(task.score(p, tok.decode(g.token_ids))) for p, g in zip(prompts, gens)]
    nlp = [float(-sum(g.log_probs)) / max(len(g.log_probs), 1) for g in gens]
    groups = [rewards[k * group:(k + 1) * group] for k in range(len(idx))]
    return {"reward_mean": round(sum(rewards) / len(rewards), 4),
            "all_equal_share": round(sum(len(set(g)) == 1 for g in groups) / len(groups), 4),
            "all_correct_share": round(sum(min(g) == 1 for g in groups) / len(groups), 4),
            "group_std_mean": round(sum(statistics.pstdev(g) for g in groups) / len(groups), 4),
            "pass_at_group": round(sum(max(g) > 0 for g in groups) / len(groups), 4),
            **({"neg_logp_mean": round(sum(nlp) / len(nlp), 4)} if nlp else {})}


def diagnose(config: str, overrides: list[str], n_groups: int) -> dict:
    cfg = load_config(config, overrides)
    train, evals = make_task(cfg.task, cfg.seed, "train"), make_task(cfg.task, cfg.seed, "eval")
    tq, eq = _questions(train, len(train)), _questions(evals, cfg.task.eval_size)
    state = warmup_state(cfg, progress=False)
    model, tok = build_model(cfg.model, cfg.seed)
    greedy = TorchEngine(model, tok, temperature=0.0, seed=cfg.seed)
    greedy.update_weights(state, 0)
    out: dict = {"config": config, "overrides": overrides, "train_rows": len(train), "train_distinct": len(tq),
                 "eval_distinct": len(eq), "eval_in_train": len(eq & tq)}
    n = min(cfg.task.eval_size, len(evals))
    for name, task in (("eval", evals), ("train", train)):
        idx = list(range(min(n, len(task))))
        gens = greedy.generate([tok.encode(task[i].prompt) for i in idx], cfg.rollout.max_new_tokens)
        out[f"greedy_{name}"] = round(sum(float(task.score(task[i], tok.decode(g.token_ids)))
                                          for i, g in zip(idx, gens)) / len(idx), 4)
    model2, _ = build_model(cfg.model, cfg.seed)
    sampler = TorchEngine(model2, tok, temperature=cfg.rollout.temperature, seed=cfg.seed)
    sampler.update_weights(state, 0)
    g = cfg.rollout.group_size
    out["sampled_train"] = group_stats(sampler, tok, train, list(range(min(n_groups, len(train)))), g,
                                       cfg.rollout.max_new_tokens)
    out["sampled_eval"] = group_stats(sampler, tok, evals, list(range(min(n_groups, len(evals)))), g,
                                      cfg.rollout.max_new_tokens)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="experiments/headroom/cpu.yaml")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(diagnose(a.config, a.overrides, a.groups), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
