"""Span names on the trainer's critical path, shared by the schedules (which record them) and the analysis
(which finds them in trace.json). Pure data: importing this pulls in nothing heavy.

The trainer lane is the Actor's (`actor`). Time in a step window that no Actor span covers is the trainer
waiting for data it has no span for (the relax schedule's streaming loader waits between micro-batches).
"""

from __future__ import annotations

TRAINER_LANE = "actor"

# Trainer-lane span names by what the trainer is doing.
WAIT_ROLLOUT = "wait for rollout"  # the trainer has nothing to train: rollout residual / queue wait
REFERENCE = "reference forward"  # reference log-probs on the critical path (done by, or waited for by, the trainer)
OLD_LOGPROB = "old log-prob recompute"
TRAIN = "train"
WEIGHT_SYNC = "weight sync"
IDLE = "idle (waiting for data)"
OTHER = "other (checkpoint, ...)"  # any other trainer span

CATEGORY = {
    # emulated veRL (one_step_off_policy): the trainer waits for the tail of the batch's generation ...
    "rollout_residual": WAIT_ROLLOUT,
    # ... emulated OpenRLHF: the trainer waits on the rollout queue for the next whole batch.
    "trainer_wait": WAIT_ROLLOUT,
    "ref_forward": REFERENCE,  # veRL: reference log-probs computed on the trainer's devices, in its step
    "ref_forward_wait": REFERENCE,  # OpenRLHF: the trainer waits for the Reference group's forward
    "old_logprob": OLD_LOGPROB,
    "train_micro_batch": TRAIN,
    "optimizer_step": TRAIN,
    "weight_publish": WEIGHT_SYNC,
    "weight_sync_barrier": WEIGHT_SYNC,  # veRL: every rollout engine loads the weights before generation goes on
    "broadcast_lock_wait": WEIGHT_SYNC,  # OpenRLHF: broadcast waits for in-flight generation (the vLLM lock)
    "checkpoint": OTHER,
}
CATEGORIES = [WAIT_ROLLOUT, IDLE, REFERENCE, OLD_LOGPROB, TRAIN, WEIGHT_SYNC, OTHER]
# Categories that are the trainer waiting on someone else (the paper's "trainer wait").
WAITING = {WAIT_ROLLOUT, IDLE}

# Spans on other lanes that are waits, not work (excluded when measuring a role's busy time).
WAIT_SPANS = {"staleness_gate", "queue_slot_wait", "generation_lock_wait", "rollout_residual", "trainer_wait",
              "ref_forward_wait", "weight_sync_barrier", "broadcast_lock_wait"}
# Reference-forward span names on the reference lane (relax and OpenRLHF run it as a service).
REFERENCE_SPANS = {"ref_log_probs", "ref_forward"}
