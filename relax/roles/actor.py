"""Actor: streams whole groups of partition k from the bus, trains one optimizer step, publishes weights.

Gradients accumulate over micro-batches as they become ready (the trainer never waits for the whole
partition); the loss denominators are applied to the accumulated gradients at the end, which is exact
for every aggregation mode because the loss is linear in them.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import ray
import torch

from relax.algorithms import LossScale
from relax.bus import StreamingLoader
from relax.emulate import emulator
from relax.fault.checkpoint import OPTIMIZER, checkpoint_due, write_checkpoint
from relax.models import state_dict_cpu
from relax.moe.fields import r3_fields
from relax.omni.fields import input_fields
from relax.roles.base import ModelRole
from relax.trainers.factory import build_trainer
from relax.weights import model_tensors

log = logging.getLogger(__name__)


class NonFiniteTrainingError(RuntimeError):
    """training.max_nonfinite_steps steps in a row had a non-finite loss or gradient norm."""

def dynamic_sampling_metrics(dropped_rows: int, draws: list[int], group_size: int) -> dict:
    """DAPO per step: rows and groups dropped (still degenerate at the cap), groups redrawn at least once, and
    the groups generated in all (draws per row summed over each group's rows once)."""
    return {"samples_dropped": dropped_rows, "groups_dropped": dropped_rows // group_size,
            "groups_resampled": sum(d > 1 for d in draws) // group_size, "groups_generated": sum(draws) // group_size}


FAULT_POLL_S = 0.02
FAULT_WAIT_S = 120.0  # a fault's target may be restarting: the driver fires it once it is back

TRAIN_FIELDS = ["prompt_ids", "response_ids", "rollout_log_probs", "advantages", "rewards", "weight_version",
                "total_len", "sample_id", "truncated"]


@ray.remote
class ActorRole(ModelRole):
    name = "actor"
    dcs_member = {"serve": True, "follow": False, "trainer": True}
    fields = TRAIN_FIELDS
    phases = ("train_partition",)

    @classmethod
    def reads(cls, cfg) -> list[str]:
        return cls.train_reads(cfg)

    @classmethod
    def train_reads(cls, cfg) -> list[str]:
        kl_loss = cfg.algorithm.kl_coef > 0 and not cfg.algorithm.kl_in_reward  # else Advantages puts it in the reward
        fields = cls.fields + (["ref_log_probs"] if kl_loss else []) + r3_fields(cfg)
        # ActorFwd: the trainer's forward, and the version it used (the row's own, unless that one was gone)
        fields += ["old_log_probs", "old_log_probs_version"] * (cfg.algorithm.old_log_probs == "actor_fwd")
        fields += ["weight_version_last"] * cfg.rollout.partial  # partial rollout: the version of a row's last token
        fields += ["keep", "ds_attempts"] * cfg.algorithm.dynamic_sampling.enabled  # DAPO: marks, draws
        return fields + input_fields(cfg)  # omni media fields / the agent loss mask

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None, ckpt_dir: str | None = None,
                 resume: bool = False):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        # The warm-up weights the controller published; after a global restart, the newest version a live
        # DCS peer holds.
        self.sync_weights(min_version=0)
        self.boot.mark("weight_fetch")
        # training.trainer: torch, or megatron (Megatron-Core GPTModel loaded from the same weights; self.model is then
        # the transformers mirror that DCS publishes, refreshed after every step)
        self.trainer = build_trainer(cfg, self.model, self.tokenizer.pad_token_id)
        self.emu = emulator(cfg)  # emulated GPUs: each unit of training work takes the cost model's time
        self.telemetry = telemetry
        self.trained_ids: list[int] = []
        self.step_ids: list[int] = []  # sample ids of the step being trained: the DCS ledger entry of its version
        self.retained: list[int] = []  # trained partitions kept on the bus until their version is committed
        self.nonfinite_run = 0  # steps in a row skipped for a non-finite loss or gradient norm
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir else None
        self.restored = self.restore_optimizer() if resume else {}
        self.boot.mark("trainer_and_optimizer")

    def backend(self) -> str:
        return super().backend() if self.emu is not None else self.trainer.describe()

    def publish(self, version: int) -> float:
        """Publish `version` through the DCS (a copy into the staging; peers pull it in the background)."""
        t0 = time.time()
        with self.rec.span("weight_publish", step=version - 1), self._paced("publish", lambda e: e.cost.publish_time()):
            self.weights.publish(version, model_tensors(self.model), sample_ids=self.step_ids)
        self.step_ids = []
        self.version = version
        return time.time() - t0

    def _paced(self, kind: str, modelled):
        import contextlib

        return self.emu.pace(kind, modelled(self.emu)) if self.emu is not None else contextlib.nullcontext()

    def run(self, steps: int, start: int = 0, recover: bool = False) -> None:
        for k in range(start, steps):
            self.await_faults(k)
            self.train_partition(k)
        self.await_faults(steps)
        self.release_committed(wait_s=60.0)
        self.rec.flush()

    def await_faults(self, k: int) -> None:
        """Wait until every configured fault meant for an earlier step has fired, then tell Telemetry this Actor is
        at step k (the faults' trigger): a fault fires in the step it names (relax/fault/inject.py)."""
        faults = self.cfg.faults
        if not faults:
            return
        due = {i for i, f in enumerate(faults) if f.at_step < k}
        deadline = time.time() + FAULT_WAIT_S + max((f.after_s for f in faults), default=0.0)
        while due:
            _, settled = ray.get(self.telemetry.fault_state.remote())
            if due <= settled:
                break
            if time.time() > deadline:
                log.warning("faults %s were due before step %d and did not fire within %.0f s; training on",
                            sorted(due - settled), k, FAULT_WAIT_S)
                break
            time.sleep(FAULT_POLL_S)
        ray.get(self.telemetry.set_actor_step.remote(k))

    def release_committed(self, wait_s: float = 0.0) -> None:
        """Clear the trained partitions whose version is committed (held by a second process): until then
        an Actor failure rolls that version back and trains the partition again, so it must stay."""
        while self.retained:
            k = self.retained[0]
            if not self.weights.wait_committed(k + 1, timeout=wait_s):
                return
            self.bus.clear(k)
            self.retained.pop(0)

    def checkpoint(self, k: int) -> None:
        """Every `health.checkpoint_every` steps: the optimizer state (and the weights, to compare a disk
        reload with a DCS recovery), written atomically."""
        if self.ckpt_dir is None or not checkpoint_due(self.cfg.health.checkpoint_every, k):
            return
        with self.rec.span("checkpoint", step=k), self._paced("checkpoint", lambda e: e.cost.checkpoint_time()):
            write_checkpoint(self.ckpt_dir, k + 1, self.trainer.optimizer_state(), state_dict_cpu(self.model))

    def restore_optimizer(self) -> dict:
        path = self.ckpt_dir / OPTIMIZER if self.ckpt_dir else None
        if path is None or not path.exists():
            return {"checkpoint_version": None}
        t0 = time.time()
        ck = torch.load(path, weights_only=False)
        self.trainer.load_optimizer_state(ck["optimizer"])
        return {"checkpoint_version": ck["version"], "optimizer_load_s": time.time() - t0,
                "optimizer_bytes": path.stat().st_size}

    def recovery_info(self, ckpt_dir: str | None = None) -> dict:
        return {**super().recovery_info(ckpt_dir), **self.restored, "resumed_version": self.version}

    def train_partition(self, k: int, loader=None, publish=None, extra: dict | None = None) -> dict:
        """One optimizer step on partition k. A schedule may pass its own `loader` (micro-batches of whole
        groups, with `wait_s`), its own `publish(version) -> seconds` and `extra` fields for the step record."""
        cfg = self.cfg
        t_start = time.time()
        if loader is None:
            loader = StreamingLoader(self.bus, k, "actor_train", self.fields, rows_total=self.rows_per_step,
                                     group_size=cfg.rollout.group_size,
                                     micro_batch_tokens=cfg.training.micro_batch_tokens)
        # Accumulate with unit denominators; divide the gradients by the true ones once all rows are seen.
        unit = LossScale(total_tokens=1, total_seqs=1)
        rewards, versions, tokens, seqs, losses = [], [], 0, 0, []
        loss_tokens = 0  # the token-mean denominator: response tokens, or the loss mask's ones (agent turns)
        loss_seqs = 0  # the seq-mean denominator: rows with at least one loss token
        dropped, draws, spans = 0, [], []  # spans: partial rollout, versions a row's tokens came from, less one
        gap, gap_tokens = 0.0, 0  # ActorFwd: |trainer - engine| old log-prob per token, the mismatch it removes
        fwd_exact = 0  # ActorFwd: rows whose old log-probs came from the version that generated them
        zero_adv, nlp, nlp_tokens = 0, 0.0, 0  # rows whose advantages are all 0 (no gradient); -log-prob of sampled tokens
        for mb in loader:
            with self.rec.span("train_micro_batch", step=k, rows=mb.size, fields=sorted(mb.data)):
                data = dict(mb.data)
                if "old_log_probs_version" in data:  # ActorFwd wrote them (an emulated schedule sets its own)
                    gap += sum(float((o - r).abs().sum()) for o, r in zip(data["old_log_probs"], data["rollout_log_probs"]))
                    gap_tokens += sum(len(r) for r in data["rollout_log_probs"])
                    fwd_exact += int((data["old_log_probs_version"] == data["weight_version"]).sum())
                data["old_log_probs"] = data.get("old_log_probs", data["rollout_log_probs"])
                keep = [i for i, x in enumerate(data.get("keep", [1] * mb.size)) if int(x)]  # DAPO: skip the groups
                if len(keep) < mb.size:  # Advantages marked degenerate (their ids stay in the ledger)
                    data = {f: v[keep] if isinstance(v, torch.Tensor) else [v[i] for i in keep] for f, v in data.items()}
                dropped += mb.size - len(keep)
                if keep:
                    with self._paced("train_micro_batch", lambda e: e.train_time(mb["sample_id"].tolist(), k)):
                        losses.append(self.trainer.accumulate(data, unit))
            rewards += mb["rewards"].tolist()
            zero_adv += sum(1 for a in mb.data.get("advantages", []) if not bool(torch.as_tensor(a).abs().gt(1e-8).any()))
            nlp -= sum(float(torch.as_tensor(r).sum()) for r in mb.data.get("rollout_log_probs", []))
            nlp_tokens += sum(len(r) for r in mb.data.get("rollout_log_probs", []))
            draws += mb["ds_attempts"].tolist() if "ds_attempts" in self.fields else []
            versions += mb["weight_version"].tolist()
            spans += (mb["weight_version_last"] - mb["weight_version"]).tolist() if "weight_version_last" in self.fields else []
            self.trained_ids += mb["sample_id"].tolist()
            self.step_ids += mb["sample_id"].tolist()
            tokens += int(sum(len(r) for r in data["response_ids"]))
            loss_tokens += int(sum(float(m.sum()) for m in data["loss_mask"])) if "loss_mask" in data else \
                int(sum(len(r) for r in data["response_ids"]))
            loss_seqs += sum(1 for m in data["loss_mask"] if float(m.sum()) > 0) if "loss_mask" in data else \
                sum(1 for r in data["response_ids"] if len(r) > 0)
            seqs += len(keep)
        with self.rec.span("optimizer_step", step=k):
            a = cfg.algorithm
            denom = LossScale(loss_tokens, loss_seqs, a.loss_norm_tokens or cfg.rollout.max_new_tokens) \
                .denominator(a.loss_agg)
            if any(f.kind == "nan" and f.at_step == k for f in cfg.faults):
                denom = float("nan")  # the injected fault (relax/fault/inject.py): loss and gradients become NaN
            loss = sum(m["loss"] for m in losses) / (denom if not math.isfinite(denom) else max(denom, 1))
            self.trainer.divide_grads(denom)
            # A non-finite loss or gradient norm: no update (the trainer drops the gradients).
            with self._paced("optimizer_step", lambda e: e.cost.optimizer_time()):
                step_metrics = self.trainer.step(skip=not math.isfinite(loss))
            if not step_metrics["skipped_nonfinite"]:
                self.trainer.sync_hf(self.model)  # Megatron: trained shards -> the published HF model (torch: no-op)
        # A skipped step still publishes its version (the same weights) with its sample ids: the pipeline's
        # versions and the ledger stay whole, and the step record says its samples trained nothing.
        self.nonfinite_run = self.nonfinite_run + 1 if step_metrics["skipped_nonfinite"] else 0
        sync_s = (publish or self.publish)(k + 1)
        self.bus.mark_trained(k)
        self.retained.append(k)
        self.release_committed()
        self.checkpoint(k)
        staleness = [k - v for v in versions]
        record = {
            "step": k,
            "end_time": time.time(),
            "train_time_s": time.time() - t_start,
            "reward_mean": sum(rewards) / len(rewards),
            "samples": seqs,
            "tokens": tokens,
            "staleness_mean": sum(staleness) / len(staleness),
            "staleness_max": max(staleness),
            "trainer_wait_s": loader.wait_s,
            "weight_sync_s": sync_s,
            "weight_version": k + 1,
            "loss": loss,
            "zero_adv_share": zero_adv / max(len(rewards), 1),  # rows that carry no policy gradient this step
            "neg_logp_mean": nlp / max(nlp_tokens, 1),  # entropy estimate of the rollout policy, per token
            **step_metrics,
            **(dynamic_sampling_metrics(dropped, draws, cfg.rollout.group_size) if "keep" in self.fields else {}),
            **({"partial_rows_share": sum(x > 0 for x in spans) / len(spans), "partial_span_max": max(spans)}
               if spans else {}),
            **({"old_rollout_gap_abs": gap / max(gap_tokens, 1), "old_log_probs_exact_share": fwd_exact / len(versions)}
               if "old_log_probs" in self.fields else {}),
            **(extra or {}),
            **(self._emulated_record(k) if self.emu is not None else {}),
        }
        for key in ("clip_frac", "approx_kl", "kl", "logp_gap_abs", "logp_gap_kl"):
            vals = [m[key] for m in losses if key in m]
            if vals:
                record[key] = sum(vals) / len(vals)
        self.rec.flush()
        # Acknowledged, not fire-and-forget: the run ends when the last step returns, and the controller (another
        # caller, so unordered with this one) must then find every step's record -- and the spans sent before it.
        ray.get(self.telemetry.add_step.remote(record))
        limit = cfg.training.max_nonfinite_steps
        if self.nonfinite_run >= limit:
            raise NonFiniteTrainingError(
                f"training: {limit} steps in a row (steps {k - limit + 1}..{k}) had a non-finite loss or gradient "
                f"norm (training.max_nonfinite_steps={limit}); stopping the run")
        return record

    def _emulated_record(self, k: int) -> dict:
        """Emulated GPUs: the step's modelled response tokens and bus bytes, and this process's paced work."""
        ids = range(k * self.rows_per_step, (k + 1) * self.rows_per_step)
        return {"emulated_response_tokens": self.emu.response_tokens(ids),
                "emulated_bus_bytes": round(self.emu.rows_bytes(ids)), "emulated_actor_work": self.emu.take_totals()}

    def sample_account(self) -> list[int]:
        """Every sample id this Actor trained on (the exactly-once account)."""
        return list(self.trained_ids)
