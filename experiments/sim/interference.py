"""Does the work a CPU profile times run slower beside an idle session of the run (Ray, the bus, one DCS member per
role process heartbeating: relax.sim.measure.idle_session) than alone? Alternating A/B/A/B in one process, medians.

    python -m experiments.sim.interference [CONFIG] [--threads N] [--reps 25]

Why `relax profile --ray` times its work inside that session: on 2026-12-06 two-thread engine calls and training
micro-batches of experiments/colocate/cpu.yaml ran 17-33% slower beside it, one-thread ones within the noise
(experiments/sim/README.md). Prints each kind of work's least, median and mean in milliseconds, with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _times(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    from relax.algorithms import LossScale
    from relax.config import load_config
    from relax.engines.torch_engine import TorchEngine
    from relax.models import build_model
    from relax.sim.measure import bus_session, idle_session
    from relax.tasks import make_task
    from relax.trainers.torch_trainer import TorchTrainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "experiments/colocate/cpu.yaml"))
    ap.add_argument("--threads", type=int, default=2, help="torch threads the work runs at")
    ap.add_argument("--reps", type=int, default=25, help="repetitions of each kind of work in each round")
    ap.add_argument("--rounds", type=int, default=2, help="alone / beside pairs")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    torch.set_num_threads(args.threads)
    model, tok = build_model(cfg.model, cfg.seed)
    task = make_task(cfg.task, cfg.seed, "train")
    ids = [tok.encode(task[i].prompt) for i in range(64)]
    batch = [ids[i % 64] for i in range(cfg.rollout.chunk_groups * cfg.rollout.group_size)]
    engine = TorchEngine(build_model(cfg.model, cfg.seed)[0], tok, dtype=cfg.rollout.dtype, seed=cfg.seed)
    tok.eos_token_id = -1  # every response runs to its length
    trainer, unit, n, L = TorchTrainer(model, tok.pad_token_id, cfg), LossScale(total_tokens=1, total_seqs=1), 64, 4
    mb = {"prompt_ids": [torch.tensor(ids[i % 64]) for i in range(n)],
          "response_ids": [torch.randint(3, tok.vocab_size, (L,)) for _ in range(n)],
          **{f: [torch.randn(L) * 0.1 - 1 for _ in range(n)]
             for f in ("old_log_probs", "advantages", "rollout_log_probs", "ref_log_probs")}}
    work = {f"generate {len(batch)} x 16 tokens": lambda: engine.generate(batch, 16),
            f"train micro-batch of {n} rows": lambda: trainer.accumulate(mb, unit)}

    def bench(tag: str) -> None:
        for name, fn in work.items():
            t = [x * 1000 for x in _times(fn, args.reps)]
            print(f"{tag:8s} {name:32s} least {min(t):7.2f}  median {statistics.median(t):7.2f}  "
                  f"mean {statistics.fmean(t):7.2f} ms", flush=True)

    print(f"{cfg.name}/{cfg.profile}, {args.threads} thread(s), load {os.getloadavg()[0]:.2f}")
    bench("warm-up")
    for _ in range(args.rounds):
        bench("alone")
        with bus_session(cfg), idle_session(cfg):
            bench("beside")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
