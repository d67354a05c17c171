"""The relax schedule: Relax's own service schedule (not emulated).

async: every role loops over partitions on its own core share, joined only by the bus; the staleness gate
bounds how far rollout runs ahead. The supervisor waits on the roles' loops, injects the configured faults
and restarts what dies (relax/fault/supervisor.py). colocate: rollout and training alternate on shared cores,
with the engine put to sleep around training; the other roles' calls of a partition follow one another in
the order their fields give (relax.roles.registry.colocate_steps).
"""

from __future__ import annotations

import ray

from relax.roles.registry import colocate_steps

LABEL = "relax"
EMULATED = False


def check(cfg) -> None:
    return None


def role_names(cfg, names: list[str]) -> list[str]:
    return names


def run(ctx, supervisor, bar) -> None:
    (run_async if ctx.cfg.mode == "async" else run_colocate)(ctx, supervisor, bar)


def run_async(ctx, supervisor, bar) -> None:
    # Every role loops on its own; the supervisor waits on them (a role's error is re-raised, naming it).
    supervisor.run(bar)


def run_colocate(ctx, supervisor, bar) -> None:
    steps = colocate_steps(ctx.cfg)
    assert steps[0] == ("rollout", "generate_partition"), steps  # the source: it reads nothing
    # Every engine generates: each replica takes a contiguous share of the partition's groups.
    replicas = list(supervisor.pool.handles().values())
    P = ctx.cfg.rollout.prompts_per_step
    n = len(replicas)
    shares = [list(range(i * P // n, (i + 1) * P // n)) for i in range(n)]
    for k in range(ctx.cfg.steps):
        ctx.obey_stop()
        wake_s = max(ray.get([r.wake.remote(k) for r in replicas])) if k > 0 else 0.0
        ray.get([r.generate_partition.remote(k, share) for r, share in zip(replicas, shares) if share])
        slept = ray.get([r.sleep.remote() for r in replicas])
        # reward, reference, critic values, advantages, the critic's value step, the Actor's step: in turn
        for name, method in steps[1:]:
            ray.get(getattr(ctx.roles[name], method).remote(k))
        ctx.step_extra[k] = {"sleep_wake_s": wake_s + max(s["sleep_s"] for s in slept),
                             "freed_bytes": sum(s["freed_bytes"] for s in slept)}
        ctx.poll(bar)
