"""OpenRLHF's async trainer, EMULATED with our kernels (schedule: openrlhf).

As `openrlhf/trainer/ppo_trainer_async.py` runs it:
  - the generator (GenerateSamplesActor.fit) takes a slot of the rollout queue (a token bucket of
    `async_queue_size`), takes the cross-actor vLLM lock, generates the whole batch, releases the lock and
    puts the batch on the queue;
  - the trainer (TrainingActor.fit) takes the next whole batch off the queue, returns the slot (the
    generator may start the next batch), makes experience (actor old log-probs and the Reference group's
    forward, launched together), trains, then broadcasts the weights to vLLM under the same lock: the
    broadcast waits for the in-flight generation to finish, and generation never sees half-loaded weights.
Here the Rollout process plays the generator and the Actor process the trainer; `async_queue_size` is
`max_staleness`. The Reference service runs the reference forward when the trainer asks for it (its own
core share, as OpenRLHF's Reference group has its own GPUs). Spans on the trainer's lane: trainer_wait,
old_logprob, ref_forward_wait, train_micro_batch, optimizer_step, broadcast_lock_wait, weight_publish.
What this leaves out: vLLM, DeepSpeed, NCCL broadcast (weights go through our store: the engine loads them
when the generator next holds the lock).
"""

from __future__ import annotations

import asyncio
import time

import ray

from relax.config import ConfigError
from relax.emulate import paced
from relax.schedules.common import (WholeBatchLoader, align, drive, fetch_all, finish, replayed_routing,
                                    trainer_fields)

LABEL = "OpenRLHF (emulated)"
EMULATED = True
SOURCE = "OpenRLHF openrlhf/trainer/ppo_trainer_async.py (GenerateSamplesActor, TrainingActor, VLLMLock)"
# R3 (moe.r3): the old-log-prob forward replays the rollout's routed experts; the Reference service replays
# them itself (relax/roles/reference.py), and so does the training forward.
SUPPORTS_R3 = True


def check(cfg) -> None:
    if cfg.mode != "async":
        raise ConfigError("mode: the openrlhf schedule emulates OpenRLHF's async trainer (separate rollout and "
                          "training devices): set mode=async")
    if cfg.max_staleness < 1:
        raise ConfigError("max_staleness: OpenRLHF's async queue holds at least one batch "
                          "(async_queue_size = max_staleness >= 1)")


def role_names(cfg, names: list[str]) -> list[str]:
    return names


@ray.remote(num_cpus=0, max_concurrency=64)
class AsyncControl:
    """The rollout queue's token bucket (slots) and the vLLM lock, as OpenRLHF's async trainer has them."""

    def __init__(self, queue_size: int):
        self.slots = asyncio.Semaphore(queue_size)
        self.lock = asyncio.Lock()

    async def ready(self) -> bool:
        return True

    async def take_slot(self) -> None:
        await self.slots.acquire()

    async def return_slot(self) -> None:
        self.slots.release()

    async def acquire(self) -> None:
        await self.lock.acquire()

    async def release(self) -> None:
        self.lock.release()


def run(ctx, supervisor, bar) -> None:
    cfg, roles = ctx.cfg, ctx.roles
    control = AsyncControl.remote(cfg.max_staleness)
    try:
        ray.get(control.ready.remote())
        # Reward, advantages (and any other streaming service) run as in relax; the trainer drives Reference.
        services = [n for n in ctx.role_names if n not in ("rollout", "actor", "reference")]
        futures = {roles[n].run.remote(cfg.steps): n for n in services}
        futures[roles["rollout"].run_schedule.remote(cfg.steps, control)] = "rollout"
        futures[roles["actor"].run_schedule.remote(cfg.steps, control, roles.get("reference"))] = "actor"
        drive(ctx, bar, futures)
    finally:
        ray.kill(control)


def generator_loop(rollout, steps: int, control) -> None:
    """Runs in the Rollout process: GenerateSamplesActor.fit."""
    rec = rollout.rec
    for k in range(steps):
        with rec.span("queue_slot_wait", step=k):
            ray.get(control.take_slot.remote())
        with rec.span("generation_lock_wait", step=k):
            ray.get(control.acquire.remote())
        try:
            rollout.generate_partition(k)  # loads the newest weights, then the whole batch, chunk by chunk
        finally:
            ray.get(control.release.remote())
    rec.flush()


def trainer_loop(actor, steps: int, control, reference) -> None:
    """Runs in the Actor process: TrainingActor.fit (train_step = make experience, train, broadcast)."""
    cfg, rec = actor.cfg, actor.rec
    G, budget, rows = cfg.rollout.group_size, cfg.training.micro_batch_tokens, actor.rows_per_step
    for k in range(steps):
        t0 = time.time()
        with rec.span("trainer_wait", step=k):
            batch = fetch_all(actor.bus, k, "actor_train", trainer_fields(actor), rows, G)
        ray.get(control.return_slot.remote())  # batch consumed: the generator may produce the next one
        t1 = time.time()
        ref_call = reference.process_partition.remote(k) if reference is not None else None
        with rec.span("old_logprob", step=k, rows=batch.size), paced(cfg, "old_logprob", lambda e: e.forward_time(
                batch["sample_id"].tolist(), "actor")):
            batch.data["old_log_probs"] = actor.trainer.log_probs(batch["prompt_ids"], batch["response_ids"], budget,
                                                                  replayed_routing(cfg, batch))
        t2 = time.time()
        if ref_call is not None:
            with rec.span("ref_forward_wait", step=k):
                ray.get(ref_call)
                refs = fetch_all(actor.bus, k, "actor_ref", ["ref_log_probs"], rows, G)
            batch.data["ref_log_probs"] = align(batch, refs, "ref_log_probs")
        t3 = time.time()
        extra = {"schedule": "openrlhf", "queue_wait_s": t1 - t0, "old_logprob_s": t2 - t1,
                 "ref_forward_wait_s": t3 - t2}

        def broadcast(version: int, k=k, extra=extra) -> float:
            ta = time.time()
            with rec.span("broadcast_lock_wait", step=k):
                ray.get(control.acquire.remote())  # waits for the in-flight generation to finish
            tb = time.time()
            try:
                actor.publish(version)
            finally:
                ray.get(control.release.remote())
            extra["broadcast_lock_wait_s"] = tb - ta
            extra["trainer_wait_s"] = extra["queue_wait_s"] + (tb - ta)
            return time.time() - ta

        actor.train_partition(k, loader=WholeBatchLoader(batch, G, budget), publish=broadcast, extra=extra)
    finish(actor)


# What each role runs in its own process for this schedule (Role.run_schedule).
LOOPS = {"rollout": generator_loop, "actor": trainer_loop}
