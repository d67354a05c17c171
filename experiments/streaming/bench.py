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
over rounds. Writes JSON to `--out` (default results/streaming_bench/<time>.json).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

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
    ap.add_argument("--out", default=None, help="JSON output (default results/streaming_bench/<time>.json)")


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
    path = write_bench(out, "streaming", args.out)
    for w in ways:
        s = summary[w]
        print(f"{w:11s} {s['tokens_per_s']:9.1f} tokens/s  partition {s['partition_s']:.2f} s  "
              f"first group {s['first_group_s']:.2f} s")
    print(f"continuous / chunked tokens/s: {summary['speedup_tokens_per_s']:.2f}x (median of {len(pairs)} pairs); "
          f"first group at {summary['first_group_ratio']:.2f}x the time; load {format_host_load(load.record)}; "
          f"wrote {path}")
    return 0
