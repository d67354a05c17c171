"""A CPU-scale agentic experiment: a tiny model learns to call the calculator, read its reply, and answer.

    python -m relax.agent.demo [--warmup 120] [--steps 30] [--out results/agent/cpu]

Task: "a*b=" for two-digit a, b (graded exactly). The intended trajectory is two model turns around one
tool observation:  <tool>calc: a*b</tool>  |<obs>c</obs>|  <answer>c</answer></s>
A short supervised warm-up on such trajectories (loss on the model's tokens only), then GRPO over
multi-turn rollouts (MultiTurnRollout over OmniEngine, ToolEnv with the real calculator and sandbox),
loss mask excluding tool / environment tokens. Writes metrics.jsonl and summary.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path

import torch

from relax.agent import MultiTurnRollout, ToolEnv, Trajectory, trajectory_rows
from relax.models import state_dict_cpu
from relax.omni.model import OmniEngine, build_tiny_omni
from relax.omni.tokenizer import OmniTokenizer
from relax.omni.train import group_advantages, grpo_loss, sft_loss


def problem(rng: random.Random) -> dict:
    a, b = rng.randrange(10, 100), rng.randrange(10, 100)
    return {"question": f"{a}*{b}=", "answer": str(a * b), "a": a, "b": b}


def demo_trajectory(tok, row) -> Trajectory:
    t = Trajectory(prompt_ids=tok.encode(row["question"]))
    call = tok.encode(f"<tool>calc: {row['a']}*{row['b']}</tool>", add_bos=False)
    t.add_model(call, [0.0] * len(call))
    t.add_observation(tok.encode(f"<obs>{row['answer']}</obs>", add_bos=False))
    ans = tok.encode(f"<answer>{row['answer']}</answer>", add_bos=False) + [tok.eos_token_id]
    t.add_model(ans, [0.0] * len(ans))
    return t


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=120)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/agent/cpu")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    rng = random.Random(a.seed)
    tok = OmniTokenizer()
    model = build_tiny_omni(96, 2, 4, 2, 192, max_position=128, seed=a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    t0 = time.time()
    model.train()
    for s in range(a.warmup):
        trajs = [demo_trajectory(tok, problem(rng)) for _ in range(32)]
        loss = sft_loss(model, trajectory_rows(trajs), list(range(32)), tok.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s % 50 == 0 or s == a.warmup - 1:
            print(f"warm-up {s}/{a.warmup} loss {float(loss.detach()):.3f}", flush=True)
    warm_s = time.time() - t0
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    engine = OmniEngine(copy.deepcopy(model), tok, temperature=1.0, seed=a.seed + 1)
    ro = MultiTurnRollout(engine, tok, max_turns=3, max_new_tokens=28, max_total_tokens=128)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = []
    t_start = time.time()
    for k in range(a.steps):
        t1 = time.time()
        rows_in = [problem(rng) for _ in range(a.prompts)]
        rows_in = [r for r in rows_in for _ in range(a.group)]
        envs = [ToolEnv() for _ in rows_in]
        trajs = ro.run(envs, rows_in)
        t2 = time.time()
        rows = trajectory_rows(trajs)
        adv = group_advantages(rows["reward"], a.group)
        opt.zero_grad(set_to_none=True)
        loss, stats = grpo_loss(model, rows, list(range(len(trajs))), adv, tok.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        engine.update_weights(state_dict_cpu(model), k + 1)
        m = {"step": k, "wall_time_s": time.time() - t_start, "step_time_s": time.time() - t1, "gen_s": t2 - t1,
             "reward_mean": float(rows["reward"].mean()), "samples": len(trajs),
             "tokens": int(sum(len(x) for x in rows["response_ids"])),
             "model_tokens": int(sum(float(x.sum()) for x in rows["loss_mask"])),
             "turns_mean": float(rows["num_turns"].float().mean()),
             "tool_calls_mean": sum(e.session.tool_calls for e in envs) / len(envs),
             "tool_errors": sum(e.session.tool_errors for e in envs),
             "truncated": int(rows["truncated"].sum()), **stats}
        metrics.append(m)
        print(json.dumps(m), flush=True)
    with open(out / "metrics.jsonl", "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    r = [m["reward_mean"] for m in metrics]
    q = max(1, len(r) // 4)
    summary = {"warmup_steps": a.warmup, "warmup_s": warm_s, "steps": a.steps, "reward_start": sum(r[:q]) / q,
               "reward_end": sum(r[-q:]) / q, "step_time_s_mean": sum(m["step_time_s"] for m in metrics) / len(metrics),
               "turns_mean": sum(m["turns_mean"] for m in metrics) / len(metrics)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
