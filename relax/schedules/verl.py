"""veRL's one-step-off-policy trainer, EMULATED with our kernels (schedule: verl).

Order of one step, as `OneStepOffRayTrainer.fit` runs it (verl recipe/one_step_off_policy/ray_trainer.py):
  1. wait for the generation of this step's batch (`gen`): the part of generation that did not overlap
     the previous step is the trainer's *rollout residual*; the batch is handed over whole, not streamed;
  2. `sync_rollout_weights`: the actor broadcasts its weights and every rollout engine loads them before
     anything goes on (a barrier; the rollout is idle meanwhile);
  3. launch the next batch's generation with those weights (so every batch is exactly one step stale);
  4. reward, then `old_log_prob` (actor forward with its current weights) and the reference forward
     (the RefPolicy worker group lives on the actor's pool), one after the other on the trainer's devices;
  5. advantages, then `update_actor`.
Here the Actor process plays the trainer (driver + actor worker group): it does 1-5 itself, in turn, and
records each on its lane (rollout_residual, weight_sync_barrier, old_logprob, ref_forward,
train_micro_batch, optimizer_step, weight_publish). Reward and advantages stay small CPU services (veRL
computes rule rewards asynchronously per sample and advantages on the driver). No Reference service is
started. What this leaves out: veRL's own kernels, NCCL, and its fully_async recipe (partial rollout).
"""

from __future__ import annotations

import copy
import time

import ray

from relax.config import ConfigError
from relax.emulate import paced
from relax.schedules.common import WholeBatchLoader, drive, fetch_all, finish, replayed_routing, trainer_fields
from relax.trainers import compute_log_probs

LABEL = "veRL (emulated)"
EMULATED = True
SOURCE = "verl recipe/one_step_off_policy/ray_trainer.py (OneStepOffRayTrainer.fit)"
# R3 (moe.r3): the batch carries the rollout's routed experts; the old-log-prob and reference forwards replay
# them, as the training forward does (veRL's router_replay mode "R3").
SUPPORTS_R3 = True


def check(cfg) -> None:
    if cfg.mode != "async":
        raise ConfigError("mode: the verl schedule emulates veRL's one-step-off-policy trainer, which runs rollout "
                          "and training on separate pools: set mode=async")
    if cfg.max_staleness != 1:
        raise ConfigError("max_staleness: veRL's one-step-off-policy trainer is exactly one step off-policy: "
                          "set max_staleness=1 with schedule=verl")


def role_names(cfg, names: list[str]) -> list[str]:
    # The reference policy runs on the trainer's pool, called in turn by the trainer: no Reference service.
    return [n for n in names if n != "reference"]


def run(ctx, supervisor, bar) -> None:
    cfg, roles = ctx.cfg, ctx.roles
    # Reward, advantages (and any other streaming service the algorithm needs) run as in relax.
    futures = {roles[n].run.remote(cfg.steps): n for n in ctx.role_names if n not in ("rollout", "actor")}
    futures[roles["actor"].run_schedule.remote(cfg.steps, roles["rollout"])] = "actor"
    drive(ctx, bar, futures)


def trainer_loop(actor, steps: int, rollout) -> None:
    """Runs in the Actor process: veRL's trainer, one step after the other."""
    cfg, rec = actor.cfg, actor.rec
    G, budget, T = cfg.rollout.group_size, cfg.training.micro_batch_tokens, cfg.rollout.temperature
    pad = actor.tokenizer.pad_token_id
    # The reference is the policy before any update (version 0), a second copy on the trainer's devices.
    ref_model = copy.deepcopy(actor.model).eval() if cfg.algorithm.kl_coef > 0 else None
    generation = {0: rollout.generate_partition.remote(0)}
    for k in range(steps):
        t0 = time.time()
        with rec.span("rollout_residual", step=k):
            ray.get(generation.pop(k))
            batch = fetch_all(actor.bus, k, "actor_train", trainer_fields(actor), actor.rows_per_step, G)
        t1 = time.time()
        with rec.span("weight_sync_barrier", step=k, version=actor.version):
            ray.get(rollout.load_weights.remote(actor.version, k + 1))  # the engine is idle: its batch is done
        t2 = time.time()
        if k + 1 < steps:
            generation[k + 1] = rollout.generate_partition.remote(k + 1)
        routing = replayed_routing(cfg, batch)
        with rec.span("old_logprob", step=k, rows=batch.size), paced(cfg, "old_logprob", lambda e: e.forward_time(
                batch["sample_id"].tolist(), "actor")):
            batch.data["old_log_probs"] = actor.trainer.log_probs(batch["prompt_ids"], batch["response_ids"], budget,
                                                                  routing)
        t3 = time.time()
        if ref_model is not None:
            with rec.span("ref_forward", step=k, rows=batch.size), paced(cfg, "ref_forward", lambda e: e.forward_time(
                    batch["sample_id"].tolist(), "actor")):
                batch.data["ref_log_probs"] = compute_log_probs(ref_model, pad, batch["prompt_ids"],
                                                                batch["response_ids"], T, budget, routing,
                                                                precision=cfg.training.precision)
        t4 = time.time()
        extra = {"schedule": "verl", "rollout_residual_s": t1 - t0, "weight_sync_barrier_s": t2 - t1,
                 "old_logprob_s": t3 - t2, "ref_forward_s": t4 - t3, "trainer_wait_s": t2 - t0}
        actor.train_partition(k, loader=WholeBatchLoader(batch, G, budget), extra=extra)
    finish(actor)


# What each role runs in its own process for this schedule (Role.run_schedule).
LOOPS = {"actor": trainer_loop}
