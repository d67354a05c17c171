"""Standalone omni RL runner: supervised warm-up, then GRPO in "colocate" and/or "async" style.

    python -m relax.omni.run experiments/omni/cpu.yaml [--mode colocate|async|both] [key=value ...]

Same components in both styles: DigitSumTask rows -> OmniProcessor feature fields -> OmniEngine (rollout,
its own copy of the weights) -> rows encoded with the bus's field codec (relax.bus.batch, what TransferQueue
stores) -> the trainer reads back only the fields it needs -> GRPO step -> weights pushed to the engine.
  colocate: generate step k, then train on it; the two phases take turns on all cores.
  async:    a rollout thread generates step k+1 (weights >= k+1 - max_staleness) while the trainer trains
            step k; each side runs on its own share of the cores.
Writes results/<experiment>/<profile>/<mode>/{config.yaml, metrics.jsonl, summary.json} and, with both
modes, results/<experiment>/<profile>/comparison.json.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import platform
import queue
import random
import threading
import time
from pathlib import Path
from typing import Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field

from relax.bus.batch import from_tensordict, to_tensordict
from relax.models import state_dict_cpu
from relax.omni.model import OmniEngine, build_tiny_omni
from relax.omni.processor import FIELDS, OmniProcessor
from relax.omni.task import DigitSumTask
from relax.omni.tokenizer import OmniTokenizer
from relax.omni.train import grpo_loss, group_advantages, sft_loss


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OmniModelCfg(Strict):
    kind: Literal["tiny_omni", "qwen3_omni"] = "tiny_omni"
    path: str | None = None  # qwen3_omni: a local HF folder (cluster only)
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)


class OmniTaskCfg(Strict):
    name: Literal["digit_sum"] = "digit_sum"
    size: int = Field(4096, ge=8)
    video_every: int = Field(4, ge=0)
    n_videos: int = Field(16, ge=1)
    rl_pool: int = Field(64, ge=1)
    eval_size: int = Field(64, ge=1)


class OmniWarmupCfg(Strict):
    steps: int = Field(200, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(3e-3, gt=0)


class OmniRLCfg(Strict):
    steps: int = Field(20, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)
    lr: float = Field(5e-4, gt=0)
    temperature: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(4, ge=1)
    max_staleness: int = Field(1, ge=0)
    clip: float = Field(0.2, gt=0)
    micro_batch: int = Field(64, ge=1)


class ClusterCfg(Strict):
    nodes: int = 1
    gpus_per_node: int = 0
    rollout_gpus: int = 0
    train_gpus: int = 0
    tensor_parallel: int = 1
    expert_parallel: int = 1


class OmniConfig(Strict):
    experiment: str = "omni"
    profile: str = "cpu"
    seed: int = 0
    modes: list[Literal["colocate", "async"]] = ["colocate", "async"]
    threads: int = Field(2, ge=1)
    model: OmniModelCfg = OmniModelCfg()
    task: OmniTaskCfg = OmniTaskCfg()
    warmup: OmniWarmupCfg = OmniWarmupCfg()
    rl: OmniRLCfg = OmniRLCfg()
    cluster: ClusterCfg = ClusterCfg()
    results_dir: str = "results"


def load(path: str | None, overrides: list[str]) -> OmniConfig:
    raw = yaml.safe_load(Path(path).read_text()) if path else {}
    for ov in overrides:
        key, _, val = ov.partition("=")
        d = raw
        *parents, last = key.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = yaml.safe_load(val)
    return OmniConfig.model_validate(raw)


# ---- data ------------------------------------------------------------------------------------------------
class Features:
    """Processor output per task item, computed once (media stay referenced by URI / path in `media_uri`)."""

    def __init__(self, task, proc):
        self.task, self.proc, self.cache = task, proc, {}

    def rows(self, indexes: list[int]) -> dict:
        missing = [i for i in dict.fromkeys(indexes) if i not in self.cache]
        if missing:
            got = self.proc.rows([{"media": self.task[i].media, "text": self.task[i].text} for i in missing])
            for j, i in enumerate(missing):
                self.cache[i] = {k: v[j] for k, v in got.items()}
        return {k: [self.cache[i][k] for i in indexes] for k in self.cache[indexes[0]]}


def media_list(rows: dict, n: int) -> list[dict]:
    return [{k: rows[k][i] for k in FIELDS} for i in range(n)]


# ---- warm-up ---------------------------------------------------------------------------------------------
def warmup(cfg: OmniConfig, tok, feats: Features, progress=True) -> tuple[dict, list[float]]:
    root = Path(os.environ.get("RELAX_CACHE", Path.home() / ".cache" / "relax")) / "omni-warmup"
    blob = json.dumps({"m": cfg.model.model_dump(), "t": cfg.task.model_dump(exclude={"rl_pool", "eval_size"}),
                       "w": cfg.warmup.model_dump(), "s": cfg.seed}, sort_keys=True)
    path = root / f"{hashlib.sha256(blob.encode()).hexdigest()[:16]}.pt"
    if path.exists():
        blob = torch.load(path, weights_only=False)
        return blob["state"], blob["losses"]
    m = cfg.model
    model = build_tiny_omni(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_size, seed=cfg.seed)
    w = cfg.warmup
    opt = torch.optim.AdamW(model.parameters(), lr=w.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.0, 1 - s / max(w.steps, 1)))
    rng = random.Random(cfg.seed)
    losses = []
    model.train()
    for step in range(w.steps):
        idx = [rng.randrange(cfg.task.size) for _ in range(w.batch_size)]
        rows = feats.rows(idx)
        rows["response_ids"] = [torch.tensor(tok.encode(feats.task[i].answer, add_bos=False) + [tok.eos_token_id])
                                for i in idx]
        loss = sft_loss(model, rows, list(range(len(idx))), tok.pad_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress and (step % 50 == 0 or step == w.steps - 1):
            print(f"warm-up {step}/{w.steps} loss {loss:.3f}", flush=True)
    state = state_dict_cpu(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state": state, "losses": losses}, tmp)
    tmp.replace(path)
    return state, losses


# ---- RL --------------------------------------------------------------------------------------------------
TRAIN_FIELDS = ["prompt_ids", "response_ids", "rollout_log_probs", "reward", *FIELDS]


class Run:
    def __init__(self, cfg: OmniConfig, state: dict, tok, feats: Features, eval_feats: Features):
        m = cfg.model
        self.cfg, self.tok, self.feats, self.eval_feats = cfg, tok, feats, eval_feats
        self.model = build_tiny_omni(m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.intermediate_size)
        self.model.load_state_dict(state)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.rl.lr, weight_decay=0.0)
        self.engine = OmniEngine(copy.deepcopy(self.model), tok, temperature=cfg.rl.temperature, seed=cfg.seed + 1)
        order = list(range(cfg.task.size))
        random.Random(cfg.seed).shuffle(order)
        self.pool = order[: cfg.task.rl_pool]

    def rollout(self, k: int) -> tuple[object, dict]:
        """Generate partition k; returns its rows encoded as the bus stores them (a TensorDict)."""
        r = self.cfg.rl
        G = r.group_size
        idx = [self.pool[(k * r.prompts_per_step + g) % len(self.pool)] for g in range(r.prompts_per_step) for _ in range(G)]
        rows = self.feats.rows(idx)
        gens = self.engine.generate([p.tolist() for p in rows["prompt_ids"]], r.max_new_tokens, media=media_list(rows, len(idx)))
        rewards = [self.feats.task.score(self.feats.task[i], self.tok.decode(g.token_ids)) for i, g in zip(idx, gens)]
        rows.update({
            "sample_id": torch.arange(len(idx)) + k * len(idx),
            "group_id": torch.tensor([k * r.prompts_per_step + g for g in range(r.prompts_per_step) for _ in range(G)]),
            "response_ids": [torch.tensor(g.token_ids, dtype=torch.long) for g in gens],
            "rollout_log_probs": [torch.tensor(g.log_probs) for g in gens],
            "reward": torch.tensor(rewards),
            "weight_version": torch.tensor([g.weight_version for g in gens]),
        })
        return to_tensordict(rows), {"version": gens[0].weight_version}

    def train(self, td) -> dict:
        rows = from_tensordict(td.select(*TRAIN_FIELDS))  # the trainer reads only the fields it needs
        n = len(rows["prompt_ids"])
        adv = group_advantages(rows["reward"].float(), self.cfg.rl.group_size)
        tokens = sum(len(x) for x in rows["response_ids"])
        self.opt.zero_grad(set_to_none=True)
        mb = self.cfg.rl.micro_batch
        stats = {}
        for lo in range(0, n, mb):
            idx = list(range(lo, min(n, lo + mb)))
            loss, stats = grpo_loss(self.model, rows, idx, adv, self.tok.pad_token_id, self.cfg.rl.clip)
            (loss * len(idx) / n).backward()
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {"reward_mean": float(rows["reward"].float().mean()), "samples": n, "tokens": tokens,
                "grad_norm": float(gn), **stats}

    def publish(self, version: int) -> float:
        t0 = time.time()
        self.engine.update_weights(state_dict_cpu(self.model), version)
        return time.time() - t0

    def evaluate(self) -> float:
        n = self.cfg.task.eval_size
        idx = list(range(n))
        rows = self.eval_feats.rows(idx)
        temp, self.engine.temperature = self.engine.temperature, 0.0
        try:
            gens = self.engine.generate([p.tolist() for p in rows["prompt_ids"]], self.cfg.rl.max_new_tokens,
                                        media=media_list(rows, n))
        finally:
            self.engine.temperature = temp
        t = self.eval_feats.task
        return sum(t.score(t[i], self.tok.decode(g.token_ids)) for i, g in zip(idx, gens)) / n


def run_mode(cfg: OmniConfig, mode: str, state, tok, feats, eval_feats, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump({**cfg.model_dump(), "mode": mode}))
    torch.manual_seed(cfg.seed)
    run = Run(cfg, state, tok, feats, eval_feats)
    torch.set_num_threads(cfg.threads)
    eval_start = run.evaluate()
    metrics = []
    t_start = time.time()
    steps = cfg.rl.steps
    if mode == "colocate":
        for k in range(steps):
            t0 = time.time()
            td, info = run.rollout(k)
            t1 = time.time()
            m = run.train(td)
            t2 = time.time()
            sync = run.publish(k + 1)
            metrics.append({"step": k, "wall_time_s": time.time() - t_start, "step_time_s": time.time() - t0,
                            "gen_s": t1 - t0, "train_s": t2 - t1, "weight_sync_s": sync, "trainer_wait_s": t1 - t0,
                            "staleness_mean": k - info["version"], **m})
            print(f"[{mode}] step {k} reward {m['reward_mean']:.3f} step {metrics[-1]['step_time_s']:.2f}s", flush=True)
    else:
        # Two roles on their own share of the cores (2 cores: one each); torch's thread pool is per-process,
        # so the split is a per-thread setting made inside each role's thread.
        per_role = max(1, cfg.threads // 2)  # threads=1: one intra-op thread per role thread
        torch.set_num_threads(per_role)
        q: queue.Queue = queue.Queue()
        trained = [-1]
        cond = threading.Condition()
        err: list[BaseException] = []
        gen_times = {}

        def producer():
            try:
                for k in range(steps):
                    with cond:  # staleness gate: k - (newest trained + 1) <= s
                        while k - (trained[0] + 1) > cfg.rl.max_staleness:
                            cond.wait()
                    t0 = time.time()
                    td, info = run.rollout(k)
                    gen_times[k] = time.time() - t0
                    q.put((k, td, info))
            except BaseException as e:  # noqa: BLE001 - surfaced by the trainer loop
                err.append(e)
                q.put(None)

        th = threading.Thread(target=producer, daemon=True)
        th.start()
        last = time.time()
        for k in range(steps):
            t0 = time.time()
            item = q.get()
            if item is None:
                raise RuntimeError("rollout thread failed") from err[0]
            _, td, info = item
            t1 = time.time()
            m = run.train(td)
            sync = run.publish(k + 1)
            with cond:
                trained[0] = k
                cond.notify_all()
            now = time.time()
            metrics.append({"step": k, "wall_time_s": now - t_start, "step_time_s": now - last,
                            "gen_s": gen_times.get(k), "train_s": now - t1 - sync, "weight_sync_s": sync,
                            "trainer_wait_s": t1 - t0, "staleness_mean": k - info["version"], **m})
            last = now
            print(f"[{mode}] step {k} reward {m['reward_mean']:.3f} step {metrics[-1]['step_time_s']:.2f}s "
                  f"staleness {k - info['version']}", flush=True)
        th.join()
        torch.set_num_threads(cfg.threads)
    eval_end = run.evaluate()
    with open(out / "metrics.jsonl", "w") as f:
        for m in metrics:
            f.write(json.dumps(m) + "\n")
    rewards = [m["reward_mean"] for m in metrics]
    q4 = max(1, len(rewards) // 4)
    steady = [m["step_time_s"] for m in metrics[1:]] or [metrics[0]["step_time_s"]]
    summary = {
        "mode": mode, "steps": steps, "wall_time_s": metrics[-1]["wall_time_s"],
        "step_time_s_mean": sum(steady) / len(steady), "steps_per_hour": 3600 * len(steady) / sum(steady),
        "tokens_per_s": sum(m["tokens"] for m in metrics) / metrics[-1]["wall_time_s"],
        "reward_start": sum(rewards[:q4]) / q4, "reward_end": sum(rewards[-q4:]) / q4,
        "eval_acc_start": eval_start, "eval_acc_end": eval_end,
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                        "threads": cfg.threads},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary), flush=True)
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--mode", choices=["colocate", "async", "both"], default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the resolved config and plan, run nothing")
    a = ap.parse_args(argv)
    if a.config and "=" in a.config:  # no config file, only overrides
        a.overrides, a.config = [a.config, *a.overrides], None
    cfg = load(a.config, a.overrides)
    modes = cfg.modes if a.mode in (None, "both") else [a.mode]
    if a.dry_run or cfg.model.kind != "tiny_omni":
        print(yaml.safe_dump(cfg.model_dump()))
        if cfg.model.kind != "tiny_omni" and not a.dry_run:
            raise SystemExit(f"model.kind={cfg.model.kind} needs the cluster engine path (see relax/omni/README.md); "
                             "this runner trains tiny_omni only")
        return None
    torch.set_num_threads(cfg.threads)
    tok = OmniTokenizer()
    t = cfg.task
    feats = Features(DigitSumTask("train", t.size, t.video_every, t.n_videos, cfg.seed), OmniProcessor(tok))
    eval_feats = Features(DigitSumTask("eval", t.eval_size, t.video_every, max(1, t.n_videos // 2), cfg.seed),
                          OmniProcessor(tok))
    t0 = time.time()
    state, losses = warmup(cfg, tok, feats)
    print(f"warm-up ready in {time.time() - t0:.1f} s (final loss {losses[-1] if losses else float('nan'):.3f})")
    root = Path(cfg.results_dir) / cfg.experiment / cfg.profile
    out = {mode: run_mode(cfg, mode, state, tok, feats, eval_feats, root / mode) for mode in modes}
    if len(out) == 2:
        comp = {"colocate_step_time_s": out["colocate"]["step_time_s_mean"],
                "async_step_time_s": out["async"]["step_time_s_mean"],
                "async_speedup": out["colocate"]["step_time_s_mean"] / out["async"]["step_time_s_mean"],
                "published_speedup_qwen3_omni_30b": 2.00,
                "reward": {m: [s["reward_start"], s["reward_end"]] for m, s in out.items()},
                "eval_acc": {m: [s["eval_acc_start"], s["eval_acc_end"]] for m, s in out.items()}}
        (root / "comparison.json").write_text(json.dumps(comp, indent=2))
        print(json.dumps(comp, indent=2))
    return out


if __name__ == "__main__":
    main()
