"""Actor: streams whole groups of partition k from the bus, trains one optimizer step, publishes weights.

Gradients accumulate over micro-batches as they become ready (the trainer never waits for the whole
partition); the loss denominators are applied to the accumulated gradients at the end, which is exact
for every aggregation mode because the loss is linear in them.
"""

from __future__ import annotations

import time

import ray
import torch

from relax.algorithms import LossScale
from relax.bus import StreamingLoader
from relax.models import state_dict_cpu
from relax.roles.base import ModelRole
from relax.trainers import TorchTrainer

TRAIN_FIELDS = ["prompt_ids", "response_ids", "rollout_log_probs", "advantages", "rewards", "weight_version",
                "total_len", "sample_id", "truncated"]


@ray.remote
class ActorRole(ModelRole):
    name = "actor"

    def __init__(self, cfg, bus, telemetry, weights, threads):
        super().__init__(cfg, bus, telemetry, weights, threads)
        self.sync_weights(min_version=0)  # start from the warm-up weights the controller published
        self.trainer = TorchTrainer(self.model, self.tokenizer.pad_token_id, cfg)
        self.telemetry = telemetry
        self.fields = TRAIN_FIELDS + (["ref_log_probs"] if cfg.algorithm.kl_coef > 0 else [])
        self.fields += ["keep"] * cfg.algorithm.dynamic_sampling.enabled  # DAPO marks from Advantages
        self.trained_ids: list[int] = []

    def publish(self, version: int) -> float:
        t0 = time.time()
        with self.rec.span("weight_publish", step=version - 1):
            ref = ray.put(state_dict_cpu(self.model))
            ray.get(self.weights.publish.remote(version, [ref]))
        self.version = version
        return time.time() - t0

    def run(self, steps: int) -> None:
        for k in range(steps):
            self.train_partition(k)
        self.rec.flush()

    def train_partition(self, k: int) -> dict:
        cfg = self.cfg
        t_start = time.time()
        loader = StreamingLoader(self.bus, k, "actor_train", self.fields, rows_total=self.rows_per_step,
                                 group_size=cfg.rollout.group_size,
                                 micro_batch_tokens=cfg.training.micro_batch_tokens)
        # Accumulate with unit denominators; divide the gradients by the true ones once all rows are seen.
        unit = LossScale(total_tokens=1, total_seqs=1)
        rewards, versions, tokens, seqs, losses = [], [], 0, 0, []
        dropped = 0
        for mb in loader:
            with self.rec.span("train_micro_batch", step=k, rows=mb.size):
                data = dict(mb.data)
                data["old_log_probs"] = data.get("old_log_probs", data["rollout_log_probs"])
                keep = [i for i, x in enumerate(data.get("keep", [1] * mb.size)) if int(x)]  # DAPO: skip the groups
                if len(keep) < mb.size:  # Advantages marked degenerate (their ids stay in the ledger)
                    data = {f: v[keep] if isinstance(v, torch.Tensor) else [v[i] for i in keep] for f, v in data.items()}
                dropped += mb.size - len(keep)
                if keep:
                    losses.append(self.trainer.accumulate(data, unit))
            rewards += mb["rewards"].tolist()
            versions += mb["weight_version"].tolist()
            self.trained_ids += mb["sample_id"].tolist()
            tokens += int(sum(len(r) for r in data["response_ids"]))
            seqs += len(keep)
        with self.rec.span("optimizer_step", step=k):
            denom = tokens if cfg.algorithm.loss_agg == "token-mean" else seqs
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(max(denom, 1))
            step_metrics = self.trainer.step()
        sync_s = self.publish(k + 1)
        self.bus.mark_trained(k)
        self.bus.clear(k)
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
            "loss": sum(m["loss"] for m in losses) / max(denom, 1),
            **step_metrics,
            **({"samples_dropped": dropped} if "keep" in self.fields else {}),
        }
        for key in ("clip_frac", "approx_kl", "kl"):
            vals = [m[key] for m in losses if key in m]
            if vals:
                record[key] = sum(vals) / len(vals)
        self.rec.flush()
        self.telemetry.add_step.remote(record)
        return record

    def sample_account(self) -> list[int]:
        """Every sample id this Actor trained on (the exactly-once account)."""
        return list(self.trained_ids)
