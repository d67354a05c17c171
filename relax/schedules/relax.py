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
    rollout = ctx.roles["rollout"]
    for k in range(ctx.cfg.steps):
        wake_s = ray.get(rollout.wake.remote(k)) if k > 0 else 0.0
        ray.get(rollout.generate_partition.remote(k))
        sleep = ray.get(rollout.sleep.remote())
        # reward, reference, critic values, advantages, the critic's value step, the Actor's step: in turn
        for name, method in steps[1:]:
            ray.get(getattr(ctx.roles[name], method).remote(k))
        ctx.step_extra[k] = {"sleep_wake_s": wake_s + sleep["sleep_s"], "freed_bytes": sleep["freed_bytes"]}
        ctx.poll(bar)
