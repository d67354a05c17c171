"""The physics limit of a configuration: what each pool's work per step costs at its best, with no schedule.

- rollout: every response token of a step decoded at the replica's best steady batch (max_running_requests or
  what the KV cache holds at the mean reservation), each request at its token-weighted mean context, plus the
  step's prefill; the pool's replicas split the work evenly (no tail, no waiting).
- actor: training every sequence of the step (FLOPs at MFU, layout collectives, bubble) and the optimizer.
- reference / actor_fwd: one forward over every sequence on their own devices.
Each counts the sequences' own tokens: the padding our trainers add to a micro-batch (relax.trainers.budget) is the
schedule's cost, not the physics'.
A separate-pool schedule cannot beat the slowest pool; a colocated one runs them one after another on the same
devices, so its limit is their sum (plus sleep/wake). Throughput limit = samples per step / that time.

The latency floor (async): partition k + s + 1 may start only once partition k is trained (the staleness gate),
and k cannot be trained before its longest response is decoded (at best alone on an engine: L) and the Actor
has trained it (T). So s + 1 steps take at least L + T: a step at least (L + T) / (s + 1), however many GPUs
each pool has. `floor_step_s` is the larger of the two limits.

The two pull apart (`tradeoff_step_s`, an estimate, not a bound): in continuous batching the longest response
decodes at the step time of its engine's whole batch, so the batch that reaches the rollout's best rate makes the
tail slowest. With every engine at one batch size B, a step takes at least the larger of the rollout's work at B's
rate and (L(B) + T) / (s + 1); `tradeoff_step_s` is the least of that over B (`tradeoff_batch`). A schedule that
varies the batch over time, or gives the tail an engine of its own, may beat it.
"""

from __future__ import annotations

from statistics import fmean

from relax.sim.sim import Simulation


def _step(sim: Simulation, step: int) -> dict:
    """Each pool's time for partition `step`'s work at its best, and the rollout's best rate."""
    c = sim.cost
    resp = [x for g in sim.resp[step] for x in g]
    p = sim.prompt
    n_mean = sum(resp) / len(resp)
    ctx = p + sum(x * x for x in resp) / (2 * sum(resp))  # a decoded token's mean context
    cap = c.kv_capacity_tokens() if c.hw.kind == "gpu" else float("inf")
    batch = int(max(1, min(c.hw.rollout.max_running_requests.at(c.b), cap // (p + n_mean))))

    def token_step(b: int) -> float:  # one decode step of b requests at the mean context
        a, bm, cc, dm = c.decode_arms(b)
        return max(a + bm * b * ctx, cc + dm * b * ctx) + c.step_overhead
    rate = batch / token_step(batch) * c.replicas  # tokens/s of the pool
    prefill = c.prefill_time([p] * len(resp)) / c.replicas
    every = range(sim.P)
    m = sim.expected_micro_batches(step)
    limits = {"rollout": sum(resp) / rate + prefill,
              "actor": c.train_time(*sim.tokens(step, every), m, rows=sim.P * sim.G) + c.optimizer_time()}
    if sim.has_ref:
        limits["reference"] = sim.forward_time(step, every, "reference", padded=False)
    if sim.has_fwd:
        limits["actor_fwd"] = sim.forward_time(step, every, "actor_fwd", padded=False)
    total, longest, s1 = sum(resp), max(resp), sim.cfg.max_staleness + 1

    def at_batch(b: int) -> tuple[float, int]:  # every engine at b: the rollout's work against the tail's latency
        t = token_step(b)
        return max(total / (b / t * c.replicas) + prefill, (longest * t + limits["actor"]) / s1), b
    tradeoff = min(at_batch(b) for b in range(1, batch + 1))
    return {"limits": limits, "rate": rate, "batch": batch, "longest": longest, "tradeoff": tradeoff}


def pool_limits(sim: Simulation, steps=None) -> dict:
    """The limits of `steps` (default: every step of the run), each the mean over those partitions (the work
    of one partition varies: 32 groups of long-tailed lengths)."""
    c, cfg = sim.cost, sim.cfg
    saved = dict(c.acc)  # pricing the limit is not simulated work: implied() must not count it
    per = [_step(sim, k) for k in (range(sim.steps) if steps is None else steps)]
    limits = {k: fmean(x["limits"][k] for x in per) for k in per[0]["limits"]}
    rate, batch = fmean(x["rate"] for x in per), fmean(x["batch"] for x in per)
    floor = None
    if cfg.mode == "colocate":
        bound = sum(limits.values()) + c.sleep_time() + c.wake_time()
        slowest = "all pools in turn (shared devices)"
    else:
        slowest = max(limits, key=limits.get)
        bound = limits[slowest]
        # each step's longest response, alone on an engine (the fastest it can be decoded)
        alone = fmean(c.generate([(sim.prompt, x["longest"])], 1)[0] for x in per)
        floor = {"longest_response_alone_s": round(alone, 3),
                 "latency_floor_s": round((alone + limits["actor"]) / (cfg.max_staleness + 1), 3),
                 "tradeoff_step_s": round(max(fmean(x["tradeoff"][0] for x in per), bound), 3),
                 "tradeoff_batch": round(fmean(x["tradeoff"][1] for x in per), 1)}
    samples = sim.P * sim.G
    c.acc.update(saved)
    out = {"limits_s": {k: round(v, 3) for k, v in limits.items()}, "bound_step_s": round(bound, 3),
           "slowest_pool": slowest, "bound_samples_per_s": round(samples / bound, 4),
           "rollout_tokens_per_s_limit": round(rate, 1), "rollout_best_batch": round(batch, 1)}
    if floor is not None:
        out.update(floor, floor_step_s=round(max(bound, floor["latency_floor_s"]), 3))
    return out
