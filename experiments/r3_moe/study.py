"""The R3 experiment (experiments/r3_moe/): overhead, log-prob mismatch, bytes, reward curves; R3 off and on.

`relax study r3_moe [--config experiments/r3_moe/cpu.yaml] [--steps N] [--reps R] [--out results]`
(the defaults are what `make reproduce-fig` runs: about 27 min on a quiet 2-core machine, warm-ups cached)

1. Overhead, side by side in one process (`overhead`): the work of one RL step (the rollout's generation
   of the step's rows with the bus conversion of its fields, the Actor's forward+backward over its
   micro-batches, the Reference's log-prob forward) is timed with R3 off and on, alternating
   off/on/on/off over `reps` rounds on the same inputs, so both see the same machine load. Overhead of a
   stage = median over rounds of (on / off) - 1. The async step's overhead is the bottleneck stage's
   (stages run in parallel on their own cores); the serial sum (all stages one after the other, as a
   colocated or synchronous schedule runs them) is reported beside it, and the emulated veRL step
   (max(generation, update + old-log-prob forward + reference forward), relax/schedules/verl.py).
2. Mismatch on the same weights (`mismatch`): the bf16 rollout engine generates a step's rows with routing
   capture; the trainer (in `training.precision`: bf16 autocast in cpu.yaml, as a bf16 GPU trainer) recomputes
   their log-probs without replay, replaying the response tokens' experts, and replaying prompt + response;
   the same off/on for an fp32 trainer and a trainer cast wholly to bf16 beside it (`TRAINERS`). Mean
   |delta log-prob|, the k3 estimate of KL(engine || trainer) on the sampled tokens, and how often the
   trainer's own top-k set equals the engine's; which tokens a routing flip touches, how much of the gap sits
   on them and how much gate weight a flip moves (`decomposition`). For the warm-up weights, the
   relax runs' final weights and other routing shapes (`--variants`); an fp32 engine gives the floor.
3. End-to-end runs (`runs`): `relax run` of the config with moe.r3 false / true (experiments/launch.py
   `spawn`), each pair started together
   so both see the same load, for our async schedule and the emulated veRL one (`--schedules`; an emulated
   schedule must declare `SUPPORTS_R3`): reward curves, step times, the Actor's in-run trainer-vs-engine gap.
Beside 1: `components` times each piece R3 adds in tight loops, `bus_overhead` the field's put + fetch cost.

Writes `<out>/r3_moe/r3_results.json` and, through `analysis.r3_moe.draw_r3`, the table and figure. The
mismatch's other settings (`--variants`, SHAPES) are in variants.yaml beside this file.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import platform
import shlex
import statistics
import time
from pathlib import Path

import torch
import yaml

from experiments import launch
from relax.algorithms import LossScale
from relax.bus.batch import from_tensordict, to_tensordict
from relax.config import ExperimentConfig, load_config
from relax.engines import TorchEngine
from relax.models import build_model
from relax.moe.capture import moe_routers
from relax.moe.fields import ROUTED_FIELD, bytes_per_sample, routing_fields
from relax.trainers import TorchTrainer, budget_slices, compute_log_probs, pack
from relax.run_folder import HostLoad, RunFolder, git_commit
from relax.trainers.torch_trainer import compute_precision

RESULTS_FILE = "r3_results.json"
# The defaults `analysis.reproduce` runs with (about 27 min on a quiet 2-core machine once the warm-ups are cached):
STEPS = 15  # each end-to-end run
# The runs' end-of-run evaluation (summary.json) on 16 prompts, not the config's 128: the study reads the training
# rewards, and 4 x 128 sampled generations per run would double a run's time.
RUN_OVERRIDES = ["task.eval_size=16"]
STAGGER_S = 15.0  # between the starts of the two runs of a pair (each runs for minutes)
# Other settings, for the mismatch only (variants.yaml beside this file): each a shell-quoted list of overrides.
_VARIANTS = yaml.safe_load((Path(__file__).parent / "variants.yaml").read_text())
SHORT_ANSWERS: str = _VARIANTS["short_answers"]
VARIANTS: list[str] = [_VARIANTS[name] for name in _VARIANTS["default"]]
SHAPES: list[str] = list(_VARIANTS["shapes"])


def _prompts(cfg: ExperimentConfig, tok, n_groups: int, offset: int = 0) -> list[list[int]]:
    from relax.tasks import make_task

    data = make_task(cfg.task, cfg.seed, "train")
    G = cfg.rollout.group_size
    return [tok.encode(data[(offset + g) % len(data)].prompt) for g in range(n_groups) for _ in range(G)]


def _engine(cfg, state, record: bool, dtype: str | None = None, seed: int = 1) -> TorchEngine:
    model, tok = build_model(cfg.model, cfg.seed)
    model.load_state_dict(state)
    r = cfg.rollout
    return TorchEngine(model, tok, dtype=dtype or r.dtype, temperature=r.temperature, top_p=r.top_p, seed=seed,
                       record_routing=record)


def _rows(cfg, engine: TorchEngine, prompts: list[list[int]], r3_prompt: bool) -> dict:
    """What the Rollout puts on the bus for `prompts` (relax/roles/rollout.py), R3 fields when recording."""
    gens = engine.generate(prompts, cfg.rollout.max_new_tokens)
    resp = [torch.tensor(g.token_ids, dtype=torch.long) for g in gens]
    n = len(prompts)
    rows = {"sample_id": torch.arange(n), "group_id": torch.arange(n) // cfg.rollout.group_size,
            "prompt_ids": [torch.tensor(p, dtype=torch.long) for p in prompts], "response_ids": resp,
            "rollout_log_probs": [torch.tensor(g.log_probs, dtype=torch.float32) for g in gens],
            "weight_version": torch.zeros(n, dtype=torch.long), "truncated": torch.zeros(n, dtype=torch.long),
            "total_len": torch.tensor([len(p) + len(x) for p, x in zip(prompts, resp)])}
    if engine.capture is not None:
        rows.update(routing_fields([g.extras["routed_experts"] for g in gens], [len(p) for p in prompts],
                                   [len(x) for x in resp], engine.capture.num_experts, with_prompt=r3_prompt))
    return rows


def _payload_bytes(rows: dict, names) -> float:
    total = 0
    for k in names:
        v = rows[k]
        total += v.numel() * v.element_size() if isinstance(v, torch.Tensor) else sum(
            t.numel() * t.element_size() for t in v)
    return total / len(rows["response_ids"])


# --- 1. overhead side by side ------------------------------------------------------------------------------
def _unit(pairs: list[tuple[float, float]]) -> dict:
    off = [a for a, _ in pairs]
    on = [b for _, b in pairs]
    return {"off_min": min(off), "on_min": min(on), "off_med": statistics.median(off), "on_med": statistics.median(on)}


def overhead(cfg: ExperimentConfig, state: dict, reps: int = 8, threads: int = 1) -> dict:
    """R3 off/on of each unit of a step's work, interleaved unit by unit (off, on, then on, off, ...) on the
    same inputs and the same sampling seed, timed by this thread's CPU time (the work done, not the wait for
    a core on a loaded machine) and by wall time. Units: a Rollout generate call of `chunk_groups` groups with
    the bus conversion of its rows (TensorDict in and out, as a put and a fetch do); an Actor micro-batch
    (forward + backward); a Reference micro-batch (log-prob forward). A stage's overhead = sum over its units
    of the best (minimum) on-time / the same sum of best off-times - 1: the least disturbed of the rounds, as
    timeit does; medians beside it."""
    torch.set_num_threads(threads)
    r = cfg.rollout
    engines = {False: _engine(cfg, state, False), True: _engine(cfg, state, True)}
    tok = engines[False].tokenizer
    trainer = TorchTrainer(build_model(cfg.model, cfg.seed)[0], tok.pad_token_id, cfg)
    trainer.model.load_state_dict(state)
    ref_model = build_model(cfg.model, cfg.seed)[0]
    ref_model.load_state_dict(state)
    prompts = _prompts(cfg, tok, r.prompts_per_step)
    chunk = r.chunk_groups * r.group_size
    budget = cfg.training.micro_batch_tokens
    clocks = {"cpu": time.thread_time, "wall": time.perf_counter}

    def timed(fn):
        t0 = {c: f() for c, f in clocks.items()}
        out = fn()
        return out, {c: f() - t0[c] for c, f in clocks.items()}

    def rollout_unit(on: bool, lo: int, seed: int) -> dict:
        engines[on].gen.manual_seed(seed)
        rows = _rows(cfg, engines[on], prompts[lo:lo + chunk], cfg.moe.r3_prompt)
        return from_tensordict(to_tensordict(rows))

    def actor_unit(on: bool, mb: dict) -> None:
        data = mb if on else {k: v for k, v in mb.items() if k != ROUTED_FIELD}
        trainer.accumulate(data, LossScale(1, 1))
        trainer.opt.zero_grad(set_to_none=True)

    def reference_unit(on: bool, mb: dict) -> None:
        compute_log_probs(ref_model, tok.pad_token_id, mb["prompt_ids"], mb["response_ids"], r.temperature, budget,
                          {ROUTED_FIELD: mb[ROUTED_FIELD]} if on else None, precision=cfg.training.precision)

    times = {c: {s: {} for s in ("rollout", "actor", "reference")} for c in clocks}

    def record(stage, unit, k, fn):
        order = (False, True) if k % 2 else (True, False)
        got = {}
        for on in order:
            out, dt = timed(lambda: fn(on))
            got[on] = (out, dt)
        if k:  # round 0 warms caches and allocators
            for c in clocks:
                times[c][stage].setdefault(unit, []).append((got[False][1][c], got[True][1][c]))
        return got[True][0]

    load = HostLoad().__enter__()
    rows_seen = None
    for k in range(reps + 1):
        parts = [record("rollout", lo, k, lambda on, lo=lo: rollout_unit(on, lo, 1000 * k + lo))
                 for lo in range(0, len(prompts), chunk)]
        rows = {key: (torch.cat([p[key] for p in parts]) if isinstance(parts[0][key], torch.Tensor)
                      else [x for p in parts for x in p[key]]) for key in parts[0]}
        rows["old_log_probs"] = rows["rollout_log_probs"]
        rows["advantages"] = [torch.ones(len(x)) for x in rows["response_ids"]]
        rows_seen = rows
        for j, (lo, hi) in enumerate(budget_slices(rows["total_len"].tolist(), budget)):
            mb = {key: v[lo:hi] for key, v in rows.items()}
            record("actor", j, k, lambda on, mb=mb: actor_unit(on, mb))
            record("reference", j, k, lambda on, mb=mb: reference_unit(on, mb))

    def summarise(t: dict) -> dict:
        stages = {}
        for name, units in t.items():
            u = [_unit(p) for p in units.values()]
            off, on = sum(x["off_min"] for x in u), sum(x["on_min"] for x in u)
            off_med, on_med = sum(x["off_med"] for x in u), sum(x["on_med"] for x in u)
            all_pairs = [x for p in units.values() for x in p]
            stages[name] = {"off_s": off, "on_s": on, "overhead_pct": 100 * (on / off - 1),
                            "median_overhead_pct": 100 * (on_med / off_med - 1),
                            "pair_ratio_median_pct": 100 * (statistics.median([b / a for a, b in all_pairs]) - 1),
                            "units": len(units), "pairs": len(all_pairs),
                            "pairs_s": {str(k): p for k, p in units.items()}}
        serial_off = sum(s["off_s"] for s in stages.values())
        serial_on = sum(s["on_s"] for s in stages.values())
        bottleneck = max(stages, key=lambda s: stages[s]["off_s"])
        return {"stages": stages, "bottleneck_stage": bottleneck,
                "async_step_overhead_pct": stages[bottleneck]["overhead_pct"],
                "serial_step_overhead_pct": 100 * (serial_on / serial_off - 1),
                "verl_step_overhead_pct": 100 * (_verl_step(stages, "on_s") / _verl_step(stages, "off_s") - 1)}

    comp = components(cfg, engines[True], trainer.model, rows_seen, chunk, budget)
    cpu = summarise(times["cpu"])
    for name, st in cpu["stages"].items():
        st["component_extra_s"] = comp[name]["extra_s"]
        st["component_overhead_pct"] = 100 * comp[name]["extra_s"] / st["off_s"]
    with_extra = {n: {"off_s": st["off_s"], "on_s": st["off_s"] + comp[n]["extra_s"]} for n, st in cpu["stages"].items()}
    bus = bus_overhead(cfg, rows_seen)
    other = [n for n in rows_seen if n not in (ROUTED_FIELD, "old_log_probs", "advantages")]
    load.__exit__(None, None, None)
    # The headline uses CPU time; wall time beside it.
    return {
        "reps": reps, "threads": threads, "load_before": load.record["loadavg_before"],
        "load_after": load.record["loadavg_after"], "clock": "cpu",
        **cpu, "wall": summarise(times["wall"]), "components": comp, "bus": bus,
        "component_async_step_overhead_pct": cpu["stages"][cpu["bottleneck_stage"]]["component_overhead_pct"],
        "component_serial_step_overhead_pct": 100 * sum(c["extra_s"] for c in comp.values())
        / sum(st["off_s"] for st in cpu["stages"].values()),
        "component_verl_step_overhead_pct": 100 * (_verl_step(with_extra, "on_s") / _verl_step(with_extra, "off_s") - 1),
        "bytes_per_sample": bytes_per_sample({ROUTED_FIELD: rows_seen[ROUTED_FIELD]}),
        "other_fields_bytes_per_sample": _payload_bytes(rows_seen, other),
        "tokens_per_sample": float(rows_seen["total_len"].float().mean()),
    }


def _verl_step(stages: dict, key: str) -> float:
    """A step of the emulated veRL schedule (relax/schedules/verl.py) from the measured units: the trainer does
    the update, the old-log-prob forward (the policy's log-prob forward with replay: the Reference unit's work)
    and the reference forward one after the other, while the next batch generates (one step off-policy)."""
    trainer = stages["actor"][key] + 2 * stages["reference"][key]
    return max(stages["rollout"][key], trainer)


def _per_call(fn, n: int, batches: int = 7) -> float:
    """CPU seconds of one call of `fn`: the best of `batches` batches of `n` calls (as timeit)."""
    out = []
    for _ in range(batches):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        out.append((time.thread_time() - t0) / n)
    return min(out)


def components(cfg: ExperimentConfig, engine: TorchEngine, model, rows: dict, chunk: int, budget: int) -> dict:
    """The work R3 adds to a step, timed piece by piece in tight loops (precise where the side-by-side
    difference of two large, noisy times is not): per stage, extra CPU seconds per step.

    rollout: the router hooks' copies (one per MoE layer per forward), cutting each row's record out of the
    buffers, building the bus field, and its TensorDict conversion both ways (put + fetch); actor: laying the
    records over the micro-batch (build_replay) and the replayed routers' extra forward + backward work;
    reference: build_replay and the extra forward work."""
    from relax.moe.capture import RoutingCapture
    from relax.moe.replay import _replay_forward, build_replay

    cap: RoutingCapture = engine.capture
    B = chunk
    n_rows = len(rows["response_ids"])
    plens = [len(p) for p in rows["prompt_ids"]]
    rlens = [len(r) for r in rows["response_ids"]]
    W = max(plens)
    # forwards per generate call: a prefill and one per decode step until the longest row ends
    forwards_per_call = 1 + max(rlens) - 1
    calls = -(-n_rows // chunk)
    cap.begin(B, W, cfg.rollout.max_new_tokens)
    cap.prefill()
    hook = cap._hook(0)
    idx_prefill = torch.randint(0, cap.num_experts, (B * W, cap.top_k))
    idx_decode = torch.randint(0, cap.num_experts, (B, cap.top_k))
    t_hook_prefill = _per_call(lambda: hook(None, None, (None, None, idx_prefill)), 200)
    cap.decode(1)
    t_hook_decode = _per_call(lambda: hook(None, None, (None, None, idx_decode)), 200)
    cap.stop()
    hooks = calls * cap.layers * (t_hook_prefill + (forwards_per_call - 1) * t_hook_decode)
    bufs = (cap.prompt, cap.resp)
    t_cut = _per_call(lambda: [cap.routes(*bufs, i, W - 1, 4) for i in range(B)], 20) * calls
    records = [r[:-1] for r in rows[ROUTED_FIELD]]
    t_field = _per_call(lambda: routing_fields(records, plens, rlens, cap.num_experts, cfg.moe.r3_prompt), 5)
    field = {ROUTED_FIELD: rows[ROUTED_FIELD]}
    t_bus = _per_call(lambda: from_tensordict(to_tensordict(field)), 5)

    routers = moe_routers(model)
    t_build = t_router = t_router_fwd = 0.0
    for lo, hi in budget_slices(rows["total_len"].tolist(), budget):
        width = max(p + r for p, r in zip(plens[lo:hi], rlens[lo:hi]))
        t_build += _per_call(lambda: build_replay(plens[lo:hi], rlens[lo:hi], width, rows[ROUTED_FIELD][lo:hi],
                                                  cap.num_experts), 5)
        experts, mask = build_replay(plens[lo:hi], rlens[lo:hi], width, rows[ROUTED_FIELD][lo:hi], cap.num_experts)
        n = experts.shape[0] * width
        hs = torch.randn(n, routers[0].hidden_dim, requires_grad=True)
        for li, r in enumerate(routers):
            e, m = experts.reshape(n, *experts.shape[2:])[:, li], mask.reshape(n)

            prec = cfg.training.precision  # the routers run in the trainer's compute precision

            def own_fb(r=r):
                with compute_precision(model, prec):
                    _, g, _ = r.__class__.forward(r, hs)
                g.float().sum().backward()

            def replay_fb(r=r, e=e, m=m):
                with compute_precision(model, prec):
                    _, g, _ = _replay_forward(r, e, m, hs)
                g.float().sum().backward()

            def fwd(fn):
                with torch.no_grad(), compute_precision(model, prec):
                    fn()

            t_router_fwd += max(0.0, _per_call(lambda: fwd(lambda: _replay_forward(r, e, m, hs)), 20)
                                - _per_call(lambda: fwd(lambda: r.__class__.forward(r, hs)), 20))
            t_router += max(0.0, _per_call(replay_fb, 20) - _per_call(own_fb, 20))
        for r in routers:
            r.weight.grad = None
    return {
        "rollout": {"extra_s": hooks + t_cut + t_field + t_bus, "hooks_s": hooks, "cut_rows_s": t_cut,
                    "build_field_s": t_field, "tensordict_s": t_bus},
        "actor": {"extra_s": t_build + t_router, "build_replay_s": t_build, "router_fwd_bwd_s": t_router},
        "reference": {"extra_s": t_build + t_router_fwd, "build_replay_s": t_build, "router_fwd_s": t_router_fwd},
    }


def bus_overhead(cfg: ExperimentConfig, rows: dict, reps: int = 20) -> dict:
    """The bus cost of the field: a step's rows put chunk by chunk (as the Rollout does) and fetched whole by
    the Actor's task and the Reference's task, with and without `rollout_routed_experts`, alternating on one
    real bus (Ray + TransferQueue, its own temp dir, shut down after). Wall time (the bus spans processes)."""
    from relax.bus import Bus
    from relax.cluster import RaySession
    from relax.roles.actor import TRAIN_FIELDS

    G = cfg.rollout.group_size
    n = len(rows["response_ids"])
    chunk = cfg.rollout.chunk_groups * G
    put_fields = ["sample_id", "group_id", "prompt_ids", "response_ids", "rollout_log_probs", "weight_version",
                  "truncated", "total_len"]
    actor_fields = [f for f in TRAIN_FIELDS if f in put_fields]
    times = {False: [], True: []}
    with RaySession(num_cpus=4):
        bus = Bus.start(cfg.bus, G, max_staleness=10**6)
        step = 0
        for k in range(reps + 1):
            for on in ((False, True) if k % 2 else (True, False)):
                names = put_fields + ([ROUTED_FIELD] if on else [])
                t0 = time.perf_counter()
                for lo in range(0, n, chunk):
                    bus.put_rows(step, {f: rows[f][lo:lo + chunk] for f in names})
                for task, fields in (("actor_train", actor_fields), ("ref_log_probs", ["prompt_ids", "response_ids"])):
                    got = 0
                    while got < n:
                        b = bus.fetch(step, task, fields + ([ROUTED_FIELD] if on else []), max_rows=n)
                        got += b.size if b is not None else 0
                dt = time.perf_counter() - t0
                bus.clear(step)
                step += 1
                if k:
                    times[on].append(dt)
        bus.close()
    off, on = min(times[False]), min(times[True])
    return {"reps": reps, "off_s": off, "on_s": on, "extra_s": on - off, "overhead_pct": 100 * (on / off - 1),
            "median_off_s": statistics.median(times[False]), "median_on_s": statistics.median(times[True]),
            "ratio_median_pct": 100 * (statistics.median([b / a for a, b in zip(times[False], times[True])]) - 1),
            "off_all_s": times[False], "on_all_s": times[True]}


# --- 2. mismatch on the same weights ------------------------------------------------------------------------
def _own_routing(model, rows, precision: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's own routing for every token of the packed rows, in its compute precision: the top-k expert
    sets (sorted) and their gate weights in the same order (normalised over the set), each [B, W, layers, k]."""
    packed = pack(rows["prompt_ids"], rows["response_ids"], 0)
    B, W = packed.input_ids.shape
    seen = []
    hooks = [r.register_forward_hook(lambda m, a, out: seen.append((out[2].detach(), out[1].detach().float())))
             for r in moe_routers(model)]
    try:
        with torch.no_grad(), compute_precision(model, precision):
            model(input_ids=packed.input_ids, attention_mask=packed.attention_mask)
    finally:
        for h in hooks:
            h.remove()
    idx = torch.stack([i for i, _ in seen], 1).view(B, W, len(seen), -1)
    gates = torch.stack([g for _, g in seen], 1).view(B, W, len(seen), -1)
    idx, order = idx.sort(-1)
    return idx, gates.gather(-1, order)


def _own_sets(model, rows, precision: str = "fp32") -> torch.Tensor:
    """The trainer's own top-k expert sets (sorted) for every token of the packed rows: [B, W, layers, k]."""
    return _own_routing(model, rows, precision)[0]


def _agreement(own: torch.Tensor, rows) -> dict:
    """How often the trainer's own top-k set (`own`, from `_own_sets`) equals the engine's, over the
    (token, layer) pairs it recorded."""
    same_p = same_r = n_p = n_r = 0
    for i, (p, rec) in enumerate(zip(rows["prompt_ids"], rows[ROUTED_FIELD])):
        P, T = len(p), rec.shape[0] - 1  # the last entry is NOT_ROUTED
        eq = (own[i, :T] == rec[:T].to(torch.long).sort(-1).values).all(-1)
        same_p, n_p = same_p + int(eq[:P].sum()), n_p + eq[:P].numel()
        same_r, n_r = same_r + int(eq[P:].sum()), n_r + eq[P:].numel()
    return {"prompt": same_p / max(n_p, 1), "response": same_r / max(n_r, 1)}


def _gap(trainer_lp: list[torch.Tensor], engine_lp: list[torch.Tensor]) -> dict:
    d = torch.cat([a - b for a, b in zip(trainer_lp, engine_lp)])
    kl = d.clamp(max=30).exp() - 1 - d
    return {"mean_abs": float(d.abs().mean()), "kl_k3": float(kl.mean()), "max_abs": float(d.abs().max()),
            "tokens": int(d.numel())}


def reduction_ci(d_off: list[torch.Tensor], d_on: list[torch.Tensor], n: int = 1000, seed: int = 0) -> dict:
    """95% interval of R3's reduction (mean |dlogp| and k3 KL, %) by a paired bootstrap over rows: the rows of
    one sample are resampled with replacement, off and on together (the same tokens), `n` times."""
    g = torch.Generator().manual_seed(seed)
    kl = lambda d: d.clamp(max=30).exp() - 1 - d  # noqa: E731
    stats = {}
    for name, f in (("mean_abs", torch.abs), ("kl_k3", kl)):
        off = torch.tensor([float(f(d).sum()) for d in d_off])
        on = torch.tensor([float(f(d).sum()) for d in d_on])
        idx = torch.randint(0, len(off), (n, len(off)), generator=g)
        o = off[idx].sum(1)
        red = torch.where(o > 0, 100 * (1 - on[idx].sum(1) / o.clamp(min=1e-30)), torch.zeros_like(o))
        lo, hi = torch.quantile(red, torch.tensor([0.025, 0.975])).tolist()
        stats[name] = [lo, hi]
    return stats


def flips(own: torch.Tensor, rows, gates: torch.Tensor | None = None) -> dict:
    """Where the trainer, routing by itself (R3 off), picks another top-k set than the bf16 engine recorded.
    `own`: the trainer's sets from `_own_sets`. Per row: `pair` [T, layers] (the (token, layer) pairs that
    differ); per response token t (its log-prob comes from the logits at position P + t - 1):
    `at` [R]: a flip at P + t - 1 in some layer (the token's own forward routes differently);
    `response` [R]: a flip anywhere in P - 1 .. P + t - 1 (the generated part of its context);
    `prompt` [R]: a flip in the prompt before P - 1 (often a shared template: it touches every row alike).
    With `gates` (the trainer's gate weights aligned with `own`, from `_own_routing`): `swapped` [T, layers],
    the gate weight the trainer gives to its experts that the engine did not pick (what a flip moves)."""
    out = {"pair": [], "at": [], "response": [], "prompt": [], "swapped": []}
    if gates is not None:
        own, order = own.sort(-1)
        gates = gates.gather(-1, order)
    else:
        own = own.sort(-1).values  # sets, not orders
    for i, (p, r, rec) in enumerate(zip(rows["prompt_ids"], rows["response_ids"], rows[ROUTED_FIELD])):
        P, R, T = len(p), len(r), rec.shape[0] - 1  # the last entry is NOT_ROUTED
        rec_sets = rec[:T].to(torch.long).sort(-1).values
        pair = (own[i, :T] != rec_sets).any(-1)  # [T, layers]
        if gates is not None:
            kept = (own[i, :T, :, :, None] == rec_sets[:, :, None, :]).any(-1)  # [T, layers, k]
            out["swapped"].append((gates[i, :T] * ~kept).sum(-1))
        pos = pair.any(-1)  # [T]
        resp = torch.cummax(pos[P - 1:].to(torch.int8), 0).values.bool()
        out["pair"].append(pair)
        out["at"].append(pos[P - 1:P - 1 + R])
        out["response"].append(resp[:R])
        out["prompt"].append(pos[:P - 1].any().expand(R))
    return out


def decomposition(fl: dict, d_off: torch.Tensor, d_on: torch.Tensor) -> dict:
    """How much of the mismatch the routing flips explain. `d_off` / `d_on`: per response token, trainer minus
    engine log-prob without / with replay (prompt + response). For the tokens with a flip of each kind and
    those without: share of tokens, mean |dlogp| and k3 KL off and on, share of the total |dlogp| off, and
    share of what replay removed (sum |d_off| - |d_on|). Replay removes the flips' effect; what it leaves is the
    dense bf16 noise every token carries (R3 cannot touch that)."""
    pairs = torch.cat([x.reshape(-1) for x in fl["pair"]])
    a_off, a_on = d_off.abs(), d_on.abs()
    kl = lambda d: d.clamp(max=30).exp() - 1 - d  # noqa: E731
    total, removed, kl_total = float(a_off.sum()) or 1.0, float((a_off - a_on).sum()), float(kl(d_off).sum()) or 1.0
    out = {"pairs_flipped": float(pairs.float().mean()), "layers": int(fl["pair"][0].shape[1]),
           "tokens": int(d_off.numel()), "removed_abs_share": removed / total}
    if fl.get("swapped"):  # the trainer's gate weight on the experts a flip swaps out, mean over flipped pairs
        sw = torch.cat([x.reshape(-1) for x in fl["swapped"]])[pairs]
        out["swapped_gate_mean"] = float(sw.mean()) if sw.numel() else 0.0

    def part(sel):
        n = int(sel.sum())
        if not n:
            return {"tokens_share": 0.0}
        return {"tokens_share": n / sel.numel(), "mean_abs_off": float(a_off[sel].mean()),
                "mean_abs_on": float(a_on[sel].mean()),
                # how far replay moves the trainer's own log-prob (what a flip changes), engine aside
                "mean_shift": float((d_on[sel] - d_off[sel]).abs().mean()), "kl_off": float(kl(d_off[sel]).mean()),
                "kl_on": float(kl(d_on[sel]).mean()), "share_of_abs_off": float(a_off[sel].sum()) / total,
                "share_of_kl_off": float(kl(d_off[sel]).sum()) / kl_total,
                "share_of_removed": float((a_off[sel] - a_on[sel]).sum()) / removed if removed else None}

    for kind in ("at", "response", "prompt"):
        sel = torch.cat(fl[kind])
        out[f"flip_{kind}"], out[f"no_flip_{kind}"] = part(sel), part(~sel)
    anywhere = torch.cat(fl["response"]) | torch.cat(fl["prompt"])
    out["flip_anywhere"], out["no_flip_anywhere"] = part(anywhere), part(~anywhere)
    return out


# Trainers compared beside the config's own (`training.precision`) in every mismatch measurement:
# fp32: everything in fp32; bf16: autocast (matmuls in bf16, fp32 master weights, residual stream and norms);
# bf16_weights: the whole trainer model cast to bf16 (weights and activations, as Megatron's Float16Module):
# on a CPU the same kernels as the bf16 engine, so only the engine's KV-cache path and padding differ.
TRAINERS = ("fp32", "bf16", "bf16_weights")


def _trainer_gaps(model, pad: int, rows, precision: str, T: float, budget: int,
                  flip_at: torch.Tensor | None = None) -> dict:
    """One trainer against the engine's log-probs of `rows`: gap without replay and with prompt + response
    replay, the reductions, and how many (token, layer) pairs it routes differently from the engine. `flip_at`
    (per response token): the tokens the headline trainer's routing flips at; the gap with replay on them and
    on the others (are those tokens more sensitive to any perturbation, routing aside?)."""
    if precision == "bf16_weights":
        model = copy.deepcopy(model).to(torch.bfloat16)
        precision = "fp32"  # no autocast: the weights themselves are bf16
    args = (model, pad, rows["prompt_ids"], rows["response_ids"], T, budget)
    eng = rows["rollout_log_probs"]
    lp_off = compute_log_probs(*args, precision=precision)
    lp_on = compute_log_probs(*args, {ROUTED_FIELD: rows[ROUTED_FIELD]}, precision=precision)
    off, on = _gap(lp_off, eng), _gap(lp_on, eng)
    fl = flips(_own_sets(model, rows, precision), rows)
    pairs = torch.cat([x.reshape(-1) for x in fl["pair"]]).float()
    return {"r3_off": off, "r3_on": on, "pairs_flipped": float(pairs.mean()),
            "tokens_flip_at": float(torch.cat(fl["at"]).float().mean()),
            "reduction_pct": {m: 100 * (1 - on[m] / off[m]) if off[m] else 0.0 for m in ("mean_abs", "kl_k3")},
            "reduction_ci95": reduction_ci([a - b for a, b in zip(lp_off, eng)], [a - b for a, b in zip(lp_on, eng)]),
            **(_split_on(torch.cat([a - b for a, b in zip(lp_on, eng)]), flip_at) if flip_at is not None else {})}


def _split_on(d_on: torch.Tensor, flip_at: torch.Tensor) -> dict:
    """Mean |dlogp| with replay on the tokens `flip_at` marks and on the others."""
    a = d_on.abs()
    return {"on_at_headline_flips": float(a[flip_at].mean()) if flip_at.any() else None,
            "on_elsewhere": float(a[~flip_at].mean()) if (~flip_at).any() else None}


def mismatch(cfg: ExperimentConfig, state: dict, n_groups: int | None = None, threads: int = 1,
             trainers=TRAINERS) -> dict:
    """bf16 engine vs the trainer (in `training.precision`) on the same weights: R3 off, response replay,
    prompt+response replay; where the routing flips and how much of the gap sits on the tokens they touch
    (`decomposition`); the same off/on gap for the other trainer precisions (`trainers`) on the same rows."""
    torch.set_num_threads(threads)
    n_groups = n_groups or 16 * cfg.rollout.prompts_per_step
    engine = _engine(cfg, state, True)
    tok = engine.tokenizer
    model = build_model(cfg.model, cfg.seed)[0]
    model.load_state_dict(state)
    prompts = _prompts(cfg, tok, n_groups, offset=10_000)
    rows = _rows(cfg, engine, prompts, True)
    T, budget, prec = cfg.rollout.temperature, cfg.training.micro_batch_tokens, cfg.training.precision
    args = (model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], T, budget)
    engine_lp = rows["rollout_log_probs"]
    lp = {"r3_off": compute_log_probs(*args, precision=prec),
          "r3_response": compute_log_probs(*args, {ROUTED_FIELD: [rec[len(p):] for p, rec in zip(
              rows["prompt_ids"], rows[ROUTED_FIELD])]}, precision=prec),
          "r3_on": compute_log_probs(*args, {ROUTED_FIELD: rows[ROUTED_FIELD]}, precision=prec)}
    out = {"engine_dtype": cfg.rollout.dtype, "trainer_precision": prec, "rows": len(prompts),
           "bytes_per_sample": bytes_per_sample({ROUTED_FIELD: rows[ROUTED_FIELD]}),
           **{k: _gap(v, engine_lp) for k, v in lp.items()},
           }
    own, gates = _own_routing(model, rows, prec)
    out["routing_agreement"] = _agreement(own, rows)
    d = {k: torch.cat([a - b for a, b in zip(v, engine_lp)]) for k, v in lp.items()}
    out["flips"] = decomposition(flips(own, rows, gates), d["r3_off"], d["r3_on"])
    if cfg.rollout.dtype != "float32":  # the floor: an fp32 engine vs the fp32 trainer (KV-cache path vs one pass)
        fp32 = _rows(cfg, _engine(cfg, state, False, dtype="float32"), prompts, True)
        out["fp32_engine_r3_off"] = _gap(compute_log_probs(model, tok.pad_token_id, fp32["prompt_ids"],
                                                           fp32["response_ids"], T, budget), fp32["rollout_log_probs"])
    for key in ("r3_response", "r3_on"):
        out[f"{key}_reduction_pct"] = {m: 100 * (1 - out[key][m] / out["r3_off"][m]) if out["r3_off"][m] else 0.0
                                       for m in ("mean_abs", "kl_k3")}
    out["r3_on_reduction_ci95"] = reduction_ci([a - b for a, b in zip(lp["r3_off"], engine_lp)],
                                               [a - b for a, b in zip(lp["r3_on"], engine_lp)])
    fl = out["flips"]
    at = torch.cat(flips(own, rows)["at"])
    out["trainers"] = {t: _trainer_gaps(model, tok.pad_token_id, rows, t, T, budget, at) if t != prec else {
        **_split_on(d["r3_on"], at),
        "r3_off": out["r3_off"], "r3_on": out["r3_on"], "pairs_flipped": fl["pairs_flipped"],
        "tokens_flip_at": fl["flip_at"]["tokens_share"], "reduction_pct": out["r3_on_reduction_pct"],
        "reduction_ci95": out["r3_on_reduction_ci95"]} for t in trainers}
    return out


# --- 3. end-to-end runs -----------------------------------------------------------------------------------
def _schedules(wanted=("relax", "verl")) -> list[str]:
    """Of `wanted`: relax, and each emulated schedule that declares it reads and replays the R3 fields."""
    out = []
    for name in wanted:
        if name == "relax":
            out.append(name)
            continue
        try:
            mod = importlib.import_module(f"relax.schedules.{name}")
        except ImportError:
            continue
        if getattr(mod, "SUPPORTS_R3", False):
            out.append(name)
    return out


def _in_run(run_dir: Path) -> dict:
    run = RunFolder(run_dir)
    rows = run.metrics()
    steady = rows[1:] or rows
    fresh = [r for r in rows if r.get("staleness_max", 1) == 0 and "logp_gap_abs" in r]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"run": str(run_dir), "steps": len(rows),
            "mean_step_time_s": mean([r["step_time_s"] for r in steady]),
            "reward": [r["reward_mean"] for r in rows], "wall_time_s": [r["wall_time_s"] for r in rows],
            "logp_gap_abs": mean([r["logp_gap_abs"] for r in steady if "logp_gap_abs" in r]),
            "logp_gap_kl": mean([r["logp_gap_kl"] for r in steady if "logp_gap_kl" in r]),
            # Steps whose every sample came from the weights being trained: the gap is the mismatch alone.
            "onpolicy_steps": len(fresh), "onpolicy_logp_gap_abs": mean([r["logp_gap_abs"] for r in fresh]),
            "onpolicy_logp_gap_kl": mean([r["logp_gap_kl"] for r in fresh]),
            "summary": run.summary()}


def _pair(config, steps, out, overrides, extra, schedule, order, p, concurrent):
    """One off/on pair of `relax run` processes: [(r3_on, run folder)]."""
    procs = []
    for on in order:
        name = f"{schedule}-r3{'on' if on else 'off'}-{time.strftime('%H%M%S')}-{p}"
        if procs and concurrent:
            time.sleep(STAGGER_S)  # two Ray nodes starting at once on a loaded machine can time out (30 s)
        log = Path(out) / f".{name}.log"
        proc = launch.spawn(config, [*RUN_OVERRIDES, *(overrides or []), *extra, f"moe.r3={str(on).lower()}"],
                            out=out, run=name, steps=steps, log=log)
        procs.append((on, proc, log))
        if not concurrent:
            proc.wait()
    failed = [f"{log} (exit {proc.proc.returncode})" for on, proc, log in procs if proc.wait() != 0]
    if failed:
        raise RuntimeError(f"{schedule} pair {p}: runs failed; see {', '.join(failed)}")
    return [(on, proc.run_dir) for on, proc, _ in procs]


def runs(config: str, steps: int | None, out: Path, pairs: int = 1, overrides: list[str] | None = None,
         concurrent: bool = True, schedules=("relax", "verl")) -> dict:
    """End-to-end runs, R3 off and on. `concurrent` (default): each pair runs side by side, as two `relax run`
    processes started together, so both see the same machine load (each gets about half of it); otherwise
    one after the other in the order off, on, on, off, ..."""
    result: dict = {}
    for schedule in _schedules(schedules):
        extra = [f"schedule={schedule}"] if schedule != "relax" else []
        for p in range(pairs):
            order = [False, True] if p % 2 == 0 else [True, False]
            for on, run_dir in _pair(config, steps, out, overrides, extra, schedule, order, p, concurrent):
                result.setdefault(schedule, {"off": [], "on": [], "concurrent": concurrent})[
                    "on" if on else "off"].append(_in_run(run_dir))
        s = result[schedule]
        ratios = [b["mean_step_time_s"] / a["mean_step_time_s"] for a, b in zip(s["off"], s["on"])]
        s["step_time_overhead_pct"] = 100 * (statistics.mean(ratios) - 1)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="experiments/r3_moe/cpu.yaml")
    p.add_argument("--steps", type=int, default=STEPS, help="steps of each end-to-end run (0: the config's)")
    p.add_argument("--reps", type=int, default=6, help="off/on rounds of the side-by-side overhead measurement")
    p.add_argument("--pairs", type=int, default=1, help="off/on pairs of end-to-end runs (0: none)")
    p.add_argument("--sequential", action="store_true",
                   help="end-to-end runs one after the other (default: each off/on pair side by side)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--skip", nargs="*", default=[], choices=["overhead", "mismatch", "runs"])
    p.add_argument("--schedules", nargs="*", default=["relax", "verl"],
                   help="schedules of the end-to-end off/on pairs (relax; verl and openrlhf are emulated)")
    p.add_argument("--mismatch-groups", type=int, default=96,
                   help="prompt groups of each mismatch measurement (0: 16 x rollout.prompts_per_step)")
    p.add_argument("--final-mismatch", nargs="*", default=["relax"],
                   help="schedules whose runs' final weights get a mismatch measurement too")
    p.add_argument("--variants", nargs="*", default=VARIANTS,
                   help='other settings for the mismatch measurement (warm-up weights), each a shell-quoted list of '
                        'overrides, e.g. "model.num_layers=2 model.num_experts=8 model.experts_per_token=2" '
                        '(variants.yaml has the shapes measured before; --variants with nothing after it measures '
                        'none)')
    p.add_argument("--update-reference", action="store_true",
                   help=f"replace {REFERENCE} with this invocation's results (small files of the runs, "
                        "r3_results.json, a README with the load average)")
    p.add_argument("overrides", nargs="*", help="dotted key=value config overrides")


def main(args: argparse.Namespace) -> int:
    from analysis.r3_moe import draw_r3
    from relax.models.warmup import warmup_state

    cfg = load_config(args.config, args.overrides)
    path = args.out / cfg.name / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keep an earlier result only for the parts skipped now (a part run now replaces its old numbers).
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = {"overhead": ["overhead"], "runs": ["runs"], "mismatch": ["mismatch", "mismatch_variants"]}
    res = {k: old[k] for part in args.skip for k in kept[part] if k in old}
    load = HostLoad().__enter__()  # the whole invocation's; save() records the load so far
    res.update(config=args.config, overrides=args.overrides, model=cfg.model.model_dump(), commit=git_commit(),
               started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               argv=args.argv, load_start=load.record["loadavg_before"],
               environment={"cpus": os.cpu_count(), "torch": torch.__version__, "machine": platform.machine(),
                            "note": "2-core CPU shared with other jobs: absolute times are under load; "
                                    "overheads are off/on ratios measured side by side"})
    state = warmup_state(cfg)

    def save():
        load.__exit__(None, None, None)
        res.update(load_end=load.record["loadavg_after"], wall_s=load.record["wall_s"])
        path.write_text(json.dumps(res, indent=1))

    if "overhead" not in args.skip:
        print("overhead: R3 off/on side by side ...", flush=True)
        res["overhead"] = overhead(cfg, state, args.reps)
        save()
    if "runs" not in args.skip and args.pairs:
        print("end-to-end runs: R3 off/on ...", flush=True)
        res["runs"] = runs(args.config, args.steps or None, args.out, args.pairs, args.overrides, not args.sequential,
                           args.schedules)
        save()
    if "mismatch" not in args.skip:
        print(f"mismatch: {cfg.rollout.dtype} engine vs {cfg.training.precision} trainer on the same weights ...",
              flush=True)
        mm = {"warmup": mismatch(cfg, state, args.mismatch_groups)}
        from safetensors.torch import load_file

        from relax.run_folder import FINAL_WEIGHTS

        for schedule, s in res.get("runs", {}).items():
            if args.final_mismatch is not None and schedule not in args.final_mismatch:
                continue
            for mode in ("off", "on"):
                if s.get(mode):
                    weights = Path(s[mode][-1]["run"]) / FINAL_WEIGHTS
                    if weights.exists():
                        mm[f"{schedule}_r3{mode}_final"] = mismatch(cfg, load_file(str(weights)),
                                                                    args.mismatch_groups)
        res["mismatch"] = mm
        save()
    if args.variants and "mismatch" not in args.skip:
        print("mismatch of the other settings (--variants, warm-up weights) ...", flush=True)
        res["mismatch_variants"] = {}
        for v in args.variants:
            over = shlex.split(v)
            vcfg = load_config(args.config, [*args.overrides, *over])
            m = vcfg.model
            key = (f"{m.num_layers} layers, {m.num_experts} experts, top-{m.experts_per_token}, {vcfg.task.name}, "
                   f"<= {vcfg.rollout.max_new_tokens} tokens")
            res["mismatch_variants"][key] = {"overrides": over,
                                             **mismatch(vcfg, warmup_state(vcfg), args.mismatch_groups)}
            save()
    for f in draw_r3(args.out, args.out / "figures", args.out / "tables"):
        print(f)
    print(path)
    (path.parent / "README.md").write_text(readme(res, path))  # kept by `relax reproduce --update-reference` too
    if args.update_reference:
        print(update_reference(res, path))
    return 0


REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference" / "r3_moe"


def update_reference(res: dict, path: Path, reference: Path = REFERENCE) -> Path:
    """Replace the committed R3 reference set with `res` (written at `path`): r3_results.json, each end-to-end
    run's small files (analysis/reference.py), and a README that records when, at which commit and under which
    load it was taken."""
    from analysis.reference import clear, copy_run, copy_small

    clear(reference)
    copy_small(path, reference / RESULTS_FILE)
    for s in (res.get("runs") or {}).values():
        for run in s["off"] + s["on"]:
            src = Path(run["run"])
            copy_run(src, reference / src.parent.name / src.name)
    (reference / "README.md").write_text(readme(res, path))
    return reference


def readme(res: dict, path: Path) -> str:
    """What the results at `path` are: command, commit, when, the load average, the headline numbers."""
    from analysis import published

    pub = lambda system, metric: f"{published.value('r3_moe', system, 'async', metric):g}%"  # noqa: E731
    oh = res.get("overhead") or {}
    finished = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    lines = ["# R3 study, reference results", "",
             f"`relax study r3_moe {' '.join(res.get('argv') or [])}` at commit {res.get('commit', '?')}, "
             f"started {res.get('started', '?')}, finished {finished} ({res.get('wall_s', 0) / 60:.1f} min wall).",
             f"1-min load average (1, 5, 15 min): at the start {res.get('load_start')}, before the overhead "
             f"measurement {oh.get('load_before')}, after it {oh.get('load_after')}, at the end {res.get('load_end')} "
             f"on {res.get('environment', {}).get('cpus')} cores.", "",
             "`r3_results.json` holds every measurement; `make figures` draws results/figures/r3_moe.png and "
             "results/tables/r3_moe.{md,csv} from it. Refresh (on a quiet machine): "
             "`relax study r3_moe --out results --update-reference` (about 30 min on 2 cores, warm-ups "
             "cached). Overheads are off/on ratios measured side by side, unit by unit (robust to load); the "
             "end-to-end pairs' step times are not. See experiments/r3_moe/README.md for the reading.", ""]
    if oh:
        lines.append(f"- R3 step-time overhead, relax async: {oh['async_step_overhead_pct']:+.2f}% side by side, "
                     f"{oh['component_async_step_overhead_pct']:+.2f}% R3 work timed (published "
                     f"{pub('relax', 'r3_step_time_overhead')}); veRL emulated "
                     f"step: {oh['verl_step_overhead_pct']:+.2f}% / {oh['component_verl_step_overhead_pct']:+.2f}% "
                     f"(published veRL {pub('verl', 'r3_step_time_overhead')}); routing adds "
                     f"{oh['bytes_per_sample']:.0f} B per sample.")
    mm = (res.get("mismatch") or {}).get("warmup")
    if mm:
        red, ci = mm["r3_on_reduction_pct"], mm.get("r3_on_reduction_ci95", {})
        span = lambda m: f" (95%: {ci[m][0]:.0f}..{ci[m][1]:.0f}%)" if m in ci else ""  # noqa: E731
        lines.append(f"- Mismatch, {mm['engine_dtype']} engine vs {mm.get('trainer_precision', 'fp32')} trainer, "
                     f"warm-up weights: R3 cuts the mean |dlogp| by {red['mean_abs']:.0f}%{span('mean_abs')} and the "
                     f"KL by {red['kl_k3']:.0f}%{span('kl_k3')} (published: "
                     f"{pub('relax', 'r3_logprob_mismatch_reduction')}).")
    return "\n".join(lines) + "\n"
