"""ActorFwd: the trainer's forward recomputes old log-probs, at the weight version that generated each row.

With `algorithm.old_log_probs: actor_fwd` the PPO ratio's denominator comes from the trainer's own model,
not the inference engine, so the ratio no longer carries the engine-versus-trainer mismatch (the rollout's
log-probs stay on the row for TIS). This is what veRL and the Relax paper do; our veRL/OpenRLHF emulations
recompute old log-probs inside the trainer, this role does the same work as a service on its own pool.

It follows the Actor's DCS versions, as the Reference holds version 0, and keeps the last few versions it
received (max_staleness + 2 copies of the weights: a row is at most max_staleness versions behind the
partition it trains in). A row whose version it never received (a version that came and went while this
role was restarting, or one the follower skipped) gets the nearest newer version it holds;
`old_log_probs_version` records the version actually used, so the mismatch this leaves is visible.
"""

from __future__ import annotations

import ray
import torch

from relax.emulate import enabled, paced
from relax.moe.fields import r3_fields
from relax.omni.fields import input_fields
from relax.roles.base import ModelRole
from relax.trainers import compute_log_probs


@ray.remote
class ActorFwdRole(ModelRole):
    name = "actor_fwd"
    task = "old_log_probs"
    fields = ["prompt_ids", "response_ids", "weight_version"]
    outputs = ["old_log_probs", "old_log_probs_version"]

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.algorithm.old_log_probs == "actor_fwd"

    @classmethod
    def reads(cls, cfg) -> list[str]:
        # R3: the rollout's experts, replayed in the forward; omni media / agent loss mask.
        # emulated GPUs: the sample ids price the forward (their modelled lengths, relax/emulate/)
        return cls.fields + r3_fields(cfg) + input_fields(cfg) + ["sample_id"] * enabled(cfg)

    @classmethod
    def membership(cls, cfg) -> dict:
        # Async: a DCS follower, so new versions arrive while it computes (as the rollout's engine does).
        return {"serve": True, "follow": cfg.mode == "async", "trainer": False}

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        self.kept: dict[int, dict[str, torch.Tensor]] = {}  # version -> a copy of its weights
        self.keep = cfg.max_staleness + 2
        self.weights.sync(-1, self._keep, min_version=0)
        self.boot.mark("weight_fetch")

    def _keep(self, state: dict, version: int) -> None:
        names = [n for n, _ in self.model.named_parameters()]
        self.kept[version] = {n: state[n].detach().clone() for n in names}
        for old in sorted(self.kept)[:-self.keep]:
            del self.kept[old]

    def _newest(self) -> int:
        return max(self.kept) if self.kept else -1

    def _version_for(self, wanted: int) -> int:
        """The held version to use for rows generated at `wanted`, receiving newer versions as needed."""
        if wanted > self._newest():  # published (the rollout generated with it): wait until it is here
            self.weights.sync(self._newest(), self._keep, min_version=wanted)
        else:
            self.weights.sync(self._newest(), self._keep, block=False)  # take a prefetched one, if any
        return min((v for v in self.kept if v >= wanted), default=self._newest())

    def _load(self, version: int) -> None:
        if self.version != version:
            with torch.no_grad():
                for name, p in self.model.named_parameters():
                    p.data.copy_(self.kept[version][name])
            self.version = version

    def compute(self, batch):
        with paced(self.cfg, "actor_fwd_forward",
                   lambda e: e.forward_time(batch["sample_id"].tolist(), "actor_fwd")):
            return self._compute(batch)

    def _compute(self, batch):
        versions = [int(v) for v in batch["weight_version"].tolist()]
        out: list[torch.Tensor | None] = [None] * batch.size
        used = [0] * batch.size
        for wanted in sorted(set(versions)):
            rows = [i for i, v in enumerate(versions) if v == wanted]
            version = self._version_for(wanted)
            self._load(version)
            sub = batch.select(rows)
            lps = compute_log_probs(self.model, self.tokenizer.pad_token_id, sub["prompt_ids"], sub["response_ids"],
                                    self.cfg.rollout.temperature, self.cfg.training.micro_batch_tokens,
                                    {f: sub[f] for f in r3_fields(self.cfg)}, {f: sub[f] for f in input_fields(self.cfg)},
                                    self.cfg.training.precision)
            for i, lp in zip(rows, lps):
                out[i], used[i] = lp, version
        return {"old_log_probs": out, "old_log_probs_version": torch.tensor(used)}
