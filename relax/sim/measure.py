"""`relax profile CONFIG [key=value ...] --out FILE`: measure this machine's hardware profile with our own code,
in the format of relax/sim/hardware/*.yaml: every number's source says "measured" and how, or "assumed (not
measured: why)" for the defaults and conventions it does not time (the second node's link, the decode efficiencies
a CPU profile folds into its decode step, and without --ray the bus and RPC costs).

What it times, for the config's model, at the config's thread counts:
- device: a square fp32 matmul (peak FLOP/s) and a copy into a reused buffer (memory bandwidth);
- links: a DCS weight transfer (relax/weights/transport.py's pair groups, gloo on loopback, dcs.bucket_mb buckets);
- rollout: TorchEngine.generate of one engine call (chunk_groups x group_size prompts) at two response lengths:
  the difference is the decode step (-> rollout.step_overhead_s, the bytes and FLOPs of a tiny model being
  negligible), the rest the prefill (-> efficiency.prefill); TorchEngine.sleep + wake (-> sleep_wake_fixed_s);
- training: the Actor's TorchTrainer (relax/trainers/torch_trainer.py) on micro-batches of two sizes, loss and
  backward included: the slope gives train_mfu, the intercept overheads.train_micro_batch_s; its log-prob forwards
  likewise (forward_mfu, forward_call_s); its optimizer step (optimizer_bytes_per_param); the Actor's checkpoint
  of the model (relax/fault/checkpoint.py: checkpoint_bytes_per_s);
- rewards: the task's own score function per sample;
- with --ray: a Ray actor round trip (rpc_s); the bus itself (relax.bus over TransferQueue): put_rows + fetch of
  rollout-like rows at two batch sizes, the slope per row (bus_row_s) and the intercept per call (bus_call_s); a Ray
  object-store put + get of 64 MiB (bus_bytes_per_s). Without it those lines are "assumed (not measured ...)" and
  keep the machine-independent default of the DESIGN notes.
- with --ray, the run's infrastructure on the machine's cores (what a CPU profile's roles share them with): the
  machine-wide busy cores of an idle session -- Ray, the bus, the DCS coordinator and one heartbeating DCS member
  per role process of the config (background_cores) -- and the CPU a bus hand-off (a put waking a consumer blocked
  in fetch) burns in the bus's own processes, TransferQueue's controller and storage and the bus coordinator
  (bus_parallel_cpu_s per call, bus_parallel_cpu_row_s per row), its callers' own CPU being their time.
- with --ray, everything above is timed inside that idle session, beside the background a run's work meets, and
  every time is the median of its repetitions (`_typical`): the cost model predicts a typical step.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from relax.config import ExperimentConfig


DCS_MB = 64  # the weights `relax profile` moves through DCS to time it


def _typical(fn, reps: int = 5) -> float:
    """Seconds of `fn`, the median of `reps` repetitions. Not the least: with --ray the work is timed beside a run's
    own background (idle_session), whose wake-ups a run's work pays too -- the least repetition is the one they
    missed (2-thread engine calls and micro-batches read 10-16% above their least in one, 2026-12-06)."""
    return _typicals([fn], reps)[0]


def _typicals(fns: list, reps: int = 5) -> list[float]:
    """`_typical` of each of `fns`, their repetitions interleaved: the two ends of a line (a slope and intercept
    from two sizes) see the same drift of a shared machine, not one end its quiet minute and the other its busy."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def machine_busy_s() -> float:
    """Core-seconds every process of this machine has been busy since boot (psutil; 10 ms ticks on Linux)."""
    import psutil

    c = psutil.cpu_times()
    return sum(getattr(c, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _m(value: float, how: str, **band) -> dict:
    return {"value": float(max(value, 0.0)), "source": f"measured ({how})", **band}


def _given(value: float, why: str) -> dict:
    """A number `relax profile` does not measure: a default or a modelling convention, sourced as assumed (so the
    simulator's summary lists it under `assumed`), never as measured."""
    return {"value": float(value), "source": f"assumed (not measured: {why})"}


ADVANTAGES_PER_ROW = _given(1e-6, "GRPO normalisation, negligible")  # not timed: a few float ops a row


def _dcs_bandwidth(cfg: ExperimentConfig, reps: int) -> float:
    """Bytes/s of a DCS weight transfer on this machine: a holder's and a receiver's PairGroups (two threads, a
    TCPStore on 127.0.0.1) moving DCS_MB in dcs.bucket_mb buckets over their reused gloo pair group."""
    import threading

    from relax.weights.transport import PairGroups, store

    st = store("127.0.0.1", 0, master=True, timeout_s=60, wait_for_workers=False)
    addr = ("127.0.0.1", st.port)
    holder, receiver = PairGroups(addr, 60, "cpu"), PairGroups(addr, 60, "cpu")
    sess = {"sid": "profile", "src": "holder", "dst": "receiver", "group": "relax-profile", "version": 0}
    bucket = int(max(1, min(cfg.dcs.bucket_mb, DCS_MB)) * 2**20) // 4
    src = [torch.randn(bucket) for _ in range(DCS_MB * 2**20 // 4 // bucket)]
    dst = [torch.empty(bucket) for _ in src]

    def once():
        t = threading.Thread(target=holder.send, args=(sess, src))
        t.start()
        receiver.receive(sess, dst)
        t.join()

    once()  # makes the pair's group (reused by every later transfer, as DCS does)
    return sum(x.numel() * 4 for x in src) / _typical(once, reps)


def profile_threads(cfg: ExperimentConfig) -> dict[str, int]:
    """The threads `measure` times each kind of work at for `cfg` (a measured profile's `threads`)."""
    return {"rollout": cfg.resources.rollout.threads, "actor": cfg.resources.actor.threads,
            "forward": forward_threads(cfg)}


def forward_threads(cfg: ExperimentConfig) -> int:
    """The threads a config's log-prob forwards run at: the Reference's (the ActorFwd's when there is no
    Reference), the roles whose forwards the cost model prices; the veRL schedule's recompute on the Actor too."""
    if cfg.algorithm.kl_coef <= 0 and cfg.algorithm.old_log_probs == "actor_fwd":
        return cfg.resources.actor_fwd.threads
    return cfg.resources.reference.threads


def measure(cfg: ExperimentConfig, ray_costs: bool = False, reps: int = 5) -> dict:
    """The profile. With `ray_costs` every number is timed inside a session of `cfg` left idle (`bus_session`, then
    `idle_session`), beside the background a run's work shares the cores with: two-thread engine calls and training
    micro-batches ran 17-33% slower there than alone (medians, alternating A/B/A/B, 2026-12-06), one-thread ones
    within the noise (threads held on every core stall at each other's interruptions), so alone they would be priced
    too fast."""
    if not ray_costs:
        return _work(cfg, reps)
    with bus_session(cfg) as bus, idle_session(cfg):
        prof = _work(cfg, reps)
        prof["overheads"].update(_ray_costs(cfg, bus, prof["prompt_tokens_mean"], reps))
    return prof


def _work(cfg: ExperimentConfig, reps: int) -> dict:
    """Everything but the Ray and bus costs: the device, the DCS link, the engine, the trainer, the rewards."""
    from relax.engines.torch_engine import TorchEngine
    from relax.models import build_model, state_dict_cpu
    from relax.sim.shapes import model_shape
    from relax.tasks import make_task
    from relax.algorithms import LossScale
    from relax.fault.checkpoint import write_checkpoint
    from relax.trainers.torch_trainer import TorchTrainer
    from relax.trainers.budget import padded_work

    shape = model_shape(cfg)
    threads = profile_threads(cfg)
    threads_r, threads_a, threads_f = threads["rollout"], threads["actor"], threads["forward"]
    torch.set_num_threads(threads_a)
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    peak = 2 * n ** 3 / _typical(lambda: torch.mm(a, b), reps * 4)
    src, dst = torch.randn(32 * 2**20 // 4), torch.empty(32 * 2**20 // 4)
    dst.copy_(src)
    bw = 2 * src.numel() * 4 / _typical(lambda: dst.copy_(src), reps * 2)

    dcs_bw = _dcs_bandwidth(cfg, reps)

    # --- rollout: one engine call at two response lengths -----------------------------------------------
    torch.set_num_threads(threads_r)
    model, tok = build_model(cfg.model, cfg.seed)
    task = make_task(cfg.task, cfg.seed, "train")
    prompts_text = [task[i].prompt for i in range(64)]
    prompt_ids = [tok.encode(t) for t in prompts_text]
    prompt_tokens = sum(map(len, prompt_ids)) / len(prompt_ids)
    B = cfg.rollout.chunk_groups * cfg.rollout.group_size
    batch = [prompt_ids[i % len(prompt_ids)] for i in range(B)]
    engine = TorchEngine(build_model(cfg.model, cfg.seed)[0], tok, dtype=cfg.rollout.dtype, seed=cfg.seed)
    eos = tok.eos_token_id
    tok.eos_token_id = -1  # every response runs to max_new_tokens: the step count is known
    try:
        short, long = 2, max(cfg.rollout.max_new_tokens, 8) * 2
        t_short, t_long = _typicals([lambda: engine.generate(batch, short), lambda: engine.generate(batch, long)], reps)
    finally:
        tok.eos_token_id = eos
    step = max((t_long - t_short) / (long - short), 1e-6)
    prefill_s = max(t_short - short * step, 1e-6)
    prefill_flops = 2.0 * shape.active_params * B * prompt_tokens + 2.0 * shape.num_layers * shape.attn_width * \
        B * prompt_tokens ** 2
    prefill_eff = min(prefill_flops / (prefill_s * peak), 1.0)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}

    def sleep_wake():
        engine.sleep()
        engine.wake(state, 0)
    sw = _typical(sleep_wake, reps)
    weight_bytes = sum(v.numel() * v.element_size() for v in state.values())
    sw_fixed = max(sw - 2 * weight_bytes / bw, 0.0)

    # --- training and forwards: two micro-batch sizes, through the Actor's own trainer ------------------------
    torch.set_num_threads(threads_a)
    trainer = TorchTrainer(model, tok.pad_token_id, cfg)
    resp_len = max(cfg.rollout.max_new_tokens // 2, 1)
    unit = LossScale(total_tokens=1, total_seqs=1)

    def rows(k):
        """k rows as the Actor's loader hands them over: ids, and the per-token fields its loss reads."""
        ps = [torch.tensor(prompt_ids[i % len(prompt_ids)]) for i in range(k)]
        per_token = {f: [torch.randn(resp_len) * 0.1 - 1.0 for _ in range(k)]
                     for f in ("old_log_probs", "advantages", "rollout_log_probs")
                     + ("ref_log_probs",) * (cfg.algorithm.kl_coef > 0)}
        mb = {"prompt_ids": ps, "response_ids": [torch.randint(3, tok.vocab_size, (resp_len,)) for _ in range(k)],
              **per_token}
        return mb, [len(p) + resp_len for p in ps]

    def fb(mb):
        trainer.accumulate(mb, unit)

    def fwd(mb):
        trainer.log_probs(mb["prompt_ids"], mb["response_ids"], cfg.training.micro_batch_tokens)

    small, big = max(cfg.rollout.group_size, 1), max(cfg.training.micro_batch_tokens // int(prompt_tokens + resp_len),
                                                     2 * cfg.rollout.group_size)
    (p1, len1), (p2, len2) = rows(small), rows(big)

    def flops(lengths, passes, budget):
        """What the trainer computes: the rows cut and padded as it does (the cost model prices the same)."""
        t, sq = padded_work(lengths, budget)
        return passes * (2.0 * shape.active_params * t + 2.0 * shape.num_layers * shape.attn_width * sq)

    def line(fn, passes, budget=None):
        t1, t2 = _typicals([lambda: fn(p1), lambda: fn(p2)], reps)
        f1, f2 = flops(len1, passes, budget), flops(len2, passes, budget)
        slope = max((t2 - t1) / max(f2 - f1, 1.0), 1e-30)
        return min(1.0 / (slope * peak), 1.0), max(t1 - slope * f1, 0.0)

    mfu, mb_fixed = line(fb, 3.0)  # a training micro-batch is one padded slice
    torch.set_num_threads(threads_f)
    fmfu, f_fixed = line(fwd, 1.0, cfg.training.micro_batch_tokens)
    torch.set_num_threads(threads_a)

    def optimizer_step():
        """The Actor's optimizer step (gradient division, clipping, AdamW) on the gradients of one micro-batch."""
        fb(p2)
        t0 = time.perf_counter()
        trainer.divide_grads(1.0)
        trainer.step()
        return time.perf_counter() - t0
    opt_s = min(optimizer_step() for _ in range(reps))
    opt_bytes = opt_s * bw / shape.total_params

    with tempfile.TemporaryDirectory(prefix="relax-profile-") as d:
        def checkpoint() -> int:
            """The Actor's periodic checkpoint of this model (relax.fault.checkpoint); the bytes it wrote."""
            return write_checkpoint(Path(d), 1, trainer.optimizer_state(), state_dict_cpu(model))
        ck_bytes = checkpoint()
        ck_s = _typical(checkpoint, reps)

    rew = _reward_per_sample(task, reps)

    prof = {
        "name": f"{platform.node() or 'this'}-cpu",
        "kind": "cpu",
        "description": (f"this machine ({torch.get_num_threads()}-thread torch, {platform.machine()}), measured by "
                        f"relax profile for {cfg.name}/{cfg.profile}: model {shape.source}, rollout threads "
                        f"{threads_r}, actor threads {threads_a}, forward threads {threads_f}, engine call of {B} "
                        f"requests"),
        "measured": True,
        "threads": threads,
        "device": {"peak_flops": _m(peak, f"fp32 {n}x{n} matmul, {threads_a} thread(s)"),
                   "memory_bytes": _given(64e9, "memory is not the bound on this machine"),
                   "memory_bw": _m(bw, "copy of 32 MiB into a reused buffer"),
                   "per_node": _m(os.cpu_count() or 1, "os.cpu_count(): the cores every role shares")},
        "links": {"intra_node": _m(dcs_bw, f"DCS pair transfer of {DCS_MB} MiB over gloo on loopback, "
                                           f"{cfg.dcs.bucket_mb} MiB buckets (relax.weights.transport.PairGroups)"),
                  "inter_node": _given(dcs_bw, "one machine: the DCS loopback transfer stands in"),
                  "host": _m(bw, "copy of 32 MiB into a reused buffer"),
                  "latency_s": _given(0.0, "loopback")},
        "efficiency": {
            "train_mfu": _m(mfu, f"slope of forward+backward time over {small} vs {big} rows"),
            "train_mfu_moe": _given(mfu, "train_mfu of the model measured, dense or not"),
            "forward_mfu": _m(fmfu, f"slope of log-prob forward time over {small} vs {big} rows, {threads_f} "
                                    f"thread(s), against the matmul peak"),
            "prefill": _m(prefill_eff, f"engine call of {B} prompts ({prompt_tokens:.1f} tokens) less its decode"),
            "decode_bw": _given(1.0, "1 by construction: the decode step is folded into rollout.step_overhead_s"),
            "decode_flops": _given(1.0, "1 by construction: the decode step is folded into rollout.step_overhead_s"),
            "link": _given(1.0, "1 by construction: folded into the bandwidths")},
        "rollout": {
            "mem_fraction": _given(1.0, "the KV cache is not a bound on a CPU"),
            "max_running_requests": _given(10**6, "the torch engine batches a whole call"),
            "step_overhead_s": _m(step, f"TorchEngine.generate of {B} requests, {long} vs {short} tokens"),
            "weight_load_pause_s": _given(sw_fixed / 2, "half the measured fixed part of TorchEngine sleep + wake")},
        "overheads": {
            "rpc_s": _given(0.0011, "DESIGN.md 5b's Ray actor round trip; run with --ray"),
            "bus_row_s": _given(1e-5, "a default; run with --ray"),
            "bus_bytes_per_s": _given(2e9, "a default; run with --ray"),
            "sleep_wake_fixed_s": _m(sw_fixed, "TorchEngine sleep + wake less the weight bytes at memory bandwidth"),
            "optimizer_bytes_per_param": _m(opt_bytes, "the Actor's optimizer step (TorchTrainer: clip + AdamW) time x "
                                                       "memory bandwidth / parameters"),
            "reward_per_sample_s": _m(rew, f"task.score ({cfg.task.name}) per sample"),
            "advantages_per_row_s": ADVANTAGES_PER_ROW,
            "train_micro_batch_s": _m(mb_fixed, "intercept of forward+backward time over micro-batch size"),
            "forward_call_s": _m(f_fixed, "intercept of log-prob forward time over batch size"),
            "checkpoint_bytes_per_s": _m(ck_bytes / ck_s, f"relax.fault.checkpoint.write_checkpoint of this model's "
                                                          f"optimizer state and weights ({ck_bytes / 2**20:.1f} MiB) "
                                                          f"to a temporary folder")},
        "prompt_tokens_mean": prompt_tokens,
    }
    return prof


def _reward_per_sample(task, reps: int) -> float:
    """Seconds of the task's own score function per sample, over a few answers right and wrong."""
    texts = ["12", "7", "abc", "3 + 4 = 7"]
    return _typical(lambda: [task.score(task[i % 64], texts[i % 4]) for i in range(64)], reps) / 64


def host_overheads(cfg: ExperimentConfig, reps: int = 5) -> dict:
    """The CPU-side costs of a run of `cfg` on this machine, as `relax profile --ray` measures them, without the
    model or the cores' background: a Ray round trip, the bus per call, row and byte, the task's reward per sample.
    An emulated run pays these for real (relax.sim.hardware.on_host prices them so)."""
    from relax.sim import prompt_tokens
    from relax.tasks import make_task

    out = {"reward_per_sample_s": _m(_reward_per_sample(make_task(cfg.task, cfg.seed, "train"), reps),
                                     f"task.score ({cfg.task.name}) per sample"),
           "advantages_per_row_s": ADVANTAGES_PER_ROW}
    with bus_session(cfg) as bus:
        out.update(_ray_costs(cfg, bus, prompt_tokens(cfg), reps, cores=False))
    return out


@contextmanager
def bus_session(cfg: ExperimentConfig):
    """A private Ray session with the bus up (relax.bus over TransferQueue), as a run has them; yields the bus."""
    from relax.bus import Bus
    from relax.cluster import RaySession
    from relax.config import BusConfig

    with RaySession(num_cpus=max(2, os.cpu_count() or 1)):
        bus = Bus.start(BusConfig(capacity_rows=4096), group_size=cfg.rollout.group_size, max_staleness=0)
        try:
            yield bus
        finally:
            bus.close()


def _ray_costs(cfg: ExperimentConfig, bus, prompt_tokens: float, reps: int = 9, cores: bool = True) -> dict:
    """Ray and bus costs in a `bus_session`; `cores`: also the CPU the bus burns in other processes and the session's
    busy cores (what a CPU profile's roles share the machine with: call it inside `idle_session`; ~10 s more)."""
    import numpy as np
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self):
            return 0

    e = Echo.remote()
    ray.get(e.ping.remote())
    rpc = _typical(lambda: [ray.get(e.ping.remote()) for _ in range(50)], 3) / 50
    big = np.zeros(64 * 2**20, np.uint8)
    t_big, t_tiny = _typicals([lambda: ray.get(ray.put(big)), lambda: ray.get(ray.put(np.zeros(256, np.uint8)))], 5)
    # The bus itself (TransferQueue, our sampler, the gate), as the roles use it: a put of rollout rows, then a
    # fetch of them by one task. Two batch sizes: the slope is the per-row cost, the intercept the per-call cost
    # that every service pays once per batch however few rows it carries.
    G, L, P = cfg.rollout.group_size, max(cfg.rollout.max_new_tokens // 2, 1), max(int(prompt_tokens), 1)
    steps = iter(range(10**6))  # a fresh partition per repetition; clearing it is not timed

    def rows(n):
        ids = torch.arange(n)
        return {"sample_id": ids, "group_id": ids // G, "prompt": [torch.zeros(P, dtype=torch.int32)] * n,
                "response": [torch.zeros(L, dtype=torch.int32)] * n, "log_probs": [torch.zeros(L)] * n}

    def put_get(n):
        """Wall seconds of one put + fetch of n rows by this process (the caller's time a call costs)."""
        k, data = next(steps), rows(n)
        t0 = time.perf_counter()
        bus.put_rows(k, data)
        got = bus.fetch(k, "profile", ["response", "log_probs"], n)
        t = time.perf_counter() - t0
        if got is None or got.size != n:
            raise RuntimeError(f"relax profile: the bus returned {got and got.size} of {n} rows")
        bus.clear(k)
        return t
    small, large = G, max(16 * G, 128)
    runs: dict[int, list[float]] = {small: [], large: []}
    for _ in range(reps):  # interleaved, as _typicals
        for n in runs:
            runs[n].append(put_get(n))
    if cores:
        extra = _hand_offs(bus, rows, steps, (small, large))
        background = idle_cores()
    sizes = {n: statistics.median(r) for n, r in runs.items()}  # the typical call, as _typical
    row = max((sizes[large] - sizes[small]) / (large - small), 0.0)
    call = max(sizes[small] - row * small, 0.0)
    out = {"rpc_s": _m(rpc, "Ray actor round trip, mean of 50"),
           "bus_row_s": _m(row, f"relax.bus put_rows + fetch of {small} vs {large} rows (TransferQueue): the slope"),
           "bus_call_s": _m(call, f"relax.bus put_rows + fetch of {small} vs {large} rows: the intercept"),
           "bus_bytes_per_s": _m(big.nbytes / max(t_big - t_tiny, 1e-9), "Ray put + get of 64 MiB")}
    if not cores:
        return out
    prow = max((extra[large] - extra[small]) / (large - small), 0.0)
    pcall = max(extra[small] - prow * small, 0.0)
    how = (f"relax.bus put_rows by one role process and fetch by another, blocked in fetch(wait) until the put "
           f"wakes it, of {small} vs {large} rows: the CPU time of the bus's own processes (relax.bus.PROCESSES, "
           f"psutil) over {HAND_OFFS} hand-offs, less theirs at rest over as long")
    return {**out, "bus_parallel_cpu_s": _m(pcall, f"{how}: the intercept"),
            "bus_parallel_cpu_row_s": _m(prow, f"{how}: the slope"),
            "background_cores": _m(background, f"machine-wide busy cores (psutil) of an idle session, the least of "
                                   f"{BACKGROUND_WINDOWS} one-second windows: Ray, the bus, the DCS coordinator, the "
                                   "driver and one DCS member per role process heartbeating; the driver's "
                                   "supervisor loop not included")}


def _hand_offs(bus, rows, steps, sizes: tuple[int, int]) -> dict[int, float]:
    """The bus's own processes' CPU seconds (relax.bus.PROCESSES) per hand-off as a run's stages make them: one
    role process puts rows, another, already blocked in fetch(wait), is woken by the put's notice and fetches them.
    Summed over HAND_OFFS hand-offs of each size, less what the same processes burn at rest over as long. The two
    role processes' own CPU is their callers' time (bus_call_s), not counted."""
    import psutil
    import ray

    from relax.bus import PROCESSES, Bus
    from relax.metrics.processes import snapshot

    @ray.remote(num_cpus=0)
    class Stage:
        def __init__(self):
            self.bus = Bus.connect()

        def put(self, k: int, n: int) -> None:
            self.bus.put_rows(k, rows(n))

        def take(self, k: int, n: int) -> int:
            got = self.bus.fetch(k, "profile", ["response", "log_probs"], n, wait=30.0)
            return 0 if got is None else got.size

    producer, consumer = Stage.remote(), Stage.remote()
    me = psutil.Process()

    def bus_cpu() -> float:
        return sum(cpu for name, cpu in snapshot(me).values() if name in PROCESSES)

    def once(n) -> tuple[float, float]:
        """(bus processes' CPU, wall) from the put until the woken fetch's follow-up work is done; the consumer's
        lookups before it blocks and the partition's clearing stay outside (a run's stage pays neither per call)."""
        k = next(steps)
        took = consumer.take.remote(k, n)
        time.sleep(HAND_OFF_ARM_S)  # the consumer is blocked in its wait before the rows land, as in a run
        t0, c0 = time.perf_counter(), bus_cpu()
        ray.get(producer.put.remote(k, n))
        if (got := ray.get(took)) != n:
            raise RuntimeError(f"relax profile: a hand-off of {n} rows delivered {got}")
        time.sleep(SETTLE_S)
        out = bus_cpu() - c0, time.perf_counter() - t0
        bus.clear(k)
        return out

    once(sizes[0])  # both processes' first calls attach to TransferQueue: not a hand-off's cost
    busy = {n: [sum(x) for x in zip(*(once(n) for _ in range(HAND_OFFS)))] for n in sizes}
    t0, c0 = time.perf_counter(), bus_cpu()
    time.sleep(max(w for _, w in busy.values()))
    rest = (bus_cpu() - c0) / (time.perf_counter() - t0)  # cores the bus's processes burn with nothing to do
    return {n: max(cpu - rest * wall, 0.0) / HAND_OFFS for n, (cpu, wall) in busy.items()}


HAND_OFF_ARM_S = 0.05  # how long a hand-off's consumer is given to block in fetch(wait) before the put
SETTLE_S = 0.05  # after a hand-off, how long its follow-up work may still run (its CPU window)
HAND_OFFS = 30  # hand-offs of each size summed: a process's CPU time ticks in 10 ms
BACKGROUND_WINDOWS = 5  # one-second windows of an idle session watched; the least busy one counts (as _best: another
# process's burst only ever adds CPU; one 4 s window read 0.52 cores on 2026-12-02 against 0.15-0.21 when quiet)


def idle_cores() -> float:
    """The machine's busy cores now, the least busy of BACKGROUND_WINDOWS one-second windows."""
    windows = []
    for _ in range(BACKGROUND_WINDOWS):
        t0, c0 = time.perf_counter(), machine_busy_s()
        time.sleep(1.0)
        windows.append((machine_busy_s() - c0) / (time.perf_counter() - t0))
    return min(windows)


@contextmanager
def idle_session(cfg: ExperimentConfig):
    """A run of `cfg` left idle, inside a `bus_session` (Ray and the bus already up): the DCS coordinator, this process
    as the driver's DCS member, Telemetry, and one idle Ray actor per role process of the run, each joined to the
    DCS as its role joins (heartbeating, serving, following). What a run's work shares the cores with."""
    import ray

    from relax.fault.supervisor import Supervisor
    from relax.metrics.telemetry import Telemetry
    from relax.roles.registry import ROLES
    from relax.schedules import role_names

    @ray.remote(num_cpus=0)
    class Member:
        def __init__(self, dcs, name: str, member: dict):
            self.dcs = dcs
            dcs.join(name, **member)

        def leave(self) -> None:
            self.dcs.leave()

    dcs = Supervisor.start_dcs(cfg)
    members = []
    try:
        dcs.join("driver", serve=True, follow=True, durable=True)
        telemetry = Telemetry.remote()
        names = [n for n in role_names(cfg) if n != "rollout"] + ["rollout"] * cfg.rollout.replicas
        members = [Member.remote(dcs, n, ROLES[n].membership(cfg)) for n in names]
        ray.get([m.__ray_ready__.remote() for m in members] + [telemetry.__ray_ready__.remote()])
        time.sleep(1.0)  # the members' first beats and long polls start
        yield
    finally:
        for m in members:
            try:
                ray.get(m.leave.remote(), timeout=10)
            except Exception:  # noqa: BLE001 -- a member that cannot leave is killed with the session
                pass
        dcs.close()


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure this machine's hardware profile (relax/sim/hardware format) with "
                       "our own code, for a config's model and threads")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", required=True, help="YAML file to write (use it with relax simulate --hardware FILE)")
    p.add_argument("--ray", action="store_true", help="also time a Ray actor round trip and object-store put/get")
    p.add_argument("--reps", type=int, default=9)
    p.set_defaults(func=main)


def main(args) -> int:
    from pathlib import Path

    import yaml

    from relax.config import load_config
    from relax.sim.hardware import HardwareProfile

    cfg = load_config(args.config, args.overrides)
    prof = measure(cfg, ray_costs=args.ray, reps=args.reps)
    extra = {"prompt_tokens_mean": prof.pop("prompt_tokens_mean")}
    HardwareProfile.model_validate(prof)  # what we write loads back
    Path(args.out).write_text(f"# measured by relax profile {args.config} on {time.strftime('%Y-%m-%d %H:%M')} "
                              f"(prompt tokens per sample {extra['prompt_tokens_mean']:.2f})\n"
                              + yaml.safe_dump(prof, sort_keys=False))
    print(f"profile (measured): {args.out}")
    return 0
