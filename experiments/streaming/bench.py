"""Benchmark: continuous batching (rollout.max_inflight) against chunked generate, side by side.

    relax bench streaming [--groups 8] [--group-size 8] [--chunk-groups 2] [--mean 48] [--sigma 1.0] [--max 512]

One partition's requests (groups x group size) on the torch engine and the config's tiny model, each with its own
response length drawn from a log-normal (median `--mean`, shape `--sigma`), truncated at `--max`: a long-tailed
mix, as reasoning RL produces. EOS is never sampled (the lengths are the limits), so both ways generate exactly
the same tokens. `chunked`: today's rollout, `chunk-groups` groups per engine call, each call decoding until its
longest row ends. `continuous`: `generate_stream` with the same number of sequences in flight
(chunk-groups x group size), a finished row replaced at the next decode step. Reported per way: generated
tokens/s, the partition's time (its rollout step time) and the time until the first whole group could go to
the bus. Rounds alternate chunked/continuous/continuous/chunked so both see the same load; ratios are medians
over rounds.

`--runs N` (default 2) then times the whole step: N alternating pairs of real async runs of
experiments/async/cpu.yaml (`--run-steps` steps, max_new_tokens `--run-max-tokens`), chunked claims against
`rollout.max_inflight` = the config's chunk (chunk_groups x group_size) in flight. Their lengths are the trained
tiny model's own (reported as tokens per sample), not the log-normal mix. Reported per way: mean step time,
tokens/s and the trainer's data-wait share, and the step-time ratio (median over pairs).
Writes JSON to `--out` (default results/streaming_bench/<time>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

import torch

from experiments.bench_output import write_bench
from relax.config import ModelConfig
from relax.engines import TorchEngine
from relax.engines.feed import fixed
from relax.run_folder import HostLoad, format_host_load


class _NoEos:
    """The tokenizer with an EOS id no token has: every request runs to its own length limit."""

    def __init__(self, tok):
        self.tok, self.pad_token_id, self.eos_token_id = tok, tok.pad_token_id, -1

    def encode(self, text):
        return self.tok.encode(text)


def lengths(n: int, median: float, sigma: float, cap: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [max(1, min(cap, round(math.exp(rng.gauss(math.log(median), sigma))))) for _ in range(n)]


def chunked(engine, prompts, limits, per_call: int, group_size: int) -> dict:
    t0 = time.perf_counter()
    first, tokens = None, 0
    for lo in range(0, len(prompts), per_call):
        gens = engine.generate(prompts[lo:lo + per_call], limits[lo:lo + per_call])
        tokens += sum(len(g.token_ids) for g in gens)
        first = first or time.perf_counter() - t0  # every group of the call lands together
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "first_group_s": first}


def continuous(engine, prompts, limits, per_call: int, group_size: int) -> dict:
    t0 = time.perf_counter()
    first, tokens, left = None, 0, {}
    for i, g in engine.generate_stream(fixed(prompts, limits), max_inflight=per_call):
        tokens += len(g.token_ids)
        group = i // group_size
        left[group] = left.get(group, group_size) - 1
        if left[group] == 0 and first is None:
            first = time.perf_counter() - t0
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "first_group_s": first}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--groups", type=int, default=8, help="groups in the partition (rollout.prompts_per_step)")
    ap.add_argument("--group-size", type=int, default=8, help="samples per group (rollout.group_size)")
    ap.add_argument("--chunk-groups", type=int, default=2, help="groups per chunked call; in flight = this x group size")
    ap.add_argument("--mean", type=float, default=48, help="median response length of the log-normal (tokens)")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-normal shape (larger: longer tail)")
    ap.add_argument("--max", type=int, default=512, help="max_new_tokens: lengths are truncated here")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (each runs both ways twice)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--runs", type=int, default=2, help="alternating pairs of real async runs (0: engine only)")
    ap.add_argument("--run-steps", type=int, default=12, help="steps of each real run")
    ap.add_argument("--run-max-tokens", type=int, default=64, help="rollout.max_new_tokens of the real runs")
    ap.add_argument("--out", default=None, help="JSON output (default results/streaming_bench/<time>.json)")


CONFIG = Path(__file__).resolve().parents[1] / "async" / "cpu.yaml"


def real_runs(args: argparse.Namespace) -> dict:
    """Alternating pairs of real async runs, chunked against streaming: the whole step, every service running."""
    import tempfile

    from relax.config import load_config
    from relax.controller import run_experiment

    base = [f"steps={args.run_steps}", f"rollout.max_new_tokens={args.run_max_tokens}"]
    cfg = load_config(CONFIG, base)
    inflight = cfg.rollout.chunk_groups * cfg.rollout.group_size
    ways = {"chunked": base, "continuous": [*base, f"rollout.max_inflight={inflight}"]}
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="relax-streaming-bench-") as out:
        for i in range(args.runs):
            for w in (("chunked", "continuous") if i % 2 == 0 else ("continuous", "chunked")):
                run_dir, s = run_experiment(load_config(CONFIG, ways[w]), out=out, run=f"{w}-{i}", progress=False)
                rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                runs[w].append({"pair": i, "step_time_s": s["mean_step_time_s"], "tokens_per_s": s["tokens_per_s"],
                                "trainer_wait_share": s["trainer_wait_share"], "samples_lost": s["samples_lost"],
                                "samples_duplicated": s["samples_duplicated"],
                                "tokens_per_sample": sum(r["tokens"] for r in rows) / sum(r["samples"] for r in rows)})
    keys = ("step_time_s", "tokens_per_s", "trainer_wait_share", "tokens_per_sample")
    out = {w: {k: statistics.median(r[k] for r in rs) for k in keys} for w, rs in runs.items()}
    out["step_time_ratio"] = statistics.median(c["step_time_s"] / k["step_time_s"]
                                               for k, c in zip(runs["chunked"], runs["continuous"]))
    return {"summary": out, "runs": runs, "overrides": ways}


def main(args: argparse.Namespace) -> int:
    from relax.models import build_model

    torch.set_num_threads(args.threads)
    model, tok = build_model(ModelConfig(), seed=0)
    engine = TorchEngine(model, _NoEos(tok), temperature=1.0, seed=0)
    n = args.groups * args.group_size
    rng = random.Random(0)
    prompts = [tok.encode(f"{rng.randint(10, 99)}+{rng.randint(10, 99)}=") for _ in range(args.groups)
               for _ in range(args.group_size)]
    per_call = args.chunk_groups * args.group_size
    ways = {"chunked": chunked, "continuous": continuous}
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    with HostLoad() as load:
        for r in range(args.rounds):
            limits = lengths(n, args.mean, args.sigma, args.max, seed=r)
            for w in ("chunked", "continuous", "continuous", "chunked"):
                runs[w].append(ways[w](engine, prompts, limits, per_call, args.group_size) | {"round": r})
    summary = {}
    for w, rs in runs.items():
        summary[w] = {"tokens_per_s": statistics.median(x["tokens"] / x["seconds"] for x in rs),
                      "partition_s": statistics.median(x["seconds"] for x in rs),
                      "first_group_s": statistics.median(x["first_group_s"] for x in rs)}
    pairs = list(zip(runs["chunked"], runs["continuous"]))
    summary["speedup_tokens_per_s"] = statistics.median((c["tokens"] / c["seconds"]) / (k["tokens"] / k["seconds"])
                                                        for k, c in pairs)
    summary["first_group_ratio"] = statistics.median(c["first_group_s"] / k["first_group_s"] for k, c in pairs)
    out = {"bench": "streaming", "args": {k: v for k, v in vars(args).items() if k not in ("func", "argv")},
           "summary": summary, "runs": runs, "host_load": load.record}
    if args.runs:
        with HostLoad() as run_load:
            out["real_runs"] = real_runs(args)
        out["real_runs"]["host_load"] = run_load.record
    path = write_bench(out, "streaming", args.out)
    for w in ways:
        s = summary[w]
        print(f"{w:11s} {s['tokens_per_s']:9.1f} tokens/s  partition {s['partition_s']:.2f} s  "
              f"first group {s['first_group_s']:.2f} s")
    print(f"continuous / chunked tokens/s: {summary['speedup_tokens_per_s']:.2f}x (median of {len(pairs)} pairs); "
          f"first group at {summary['first_group_ratio']:.2f}x the time; load {format_host_load(load.record)}; "
          f"wrote {path}")
    if args.runs:
        e2e = out["real_runs"]["summary"]
        for w in ways:
            x = e2e[w]
            print(f"real run {w:11s} {x['step_time_s']:.3f} s/step  {x['tokens_per_s']:7.1f} tokens/s  trainer wait "
                  f"{x['trainer_wait_share']:.0%}  {x['tokens_per_sample']:.1f} tokens/sample")
        print(f"continuous / chunked step time: {e2e['step_time_ratio']:.2f}x (median of {args.runs} pairs); load "
              f"{format_host_load(out['real_runs']['host_load'])}")
    return 0
