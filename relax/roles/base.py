"""What every role (service) shares: its process setup, the bus, spans, and the partition loop.

A role is a Ray actor in its own process. It reads the fields it needs from the bus and writes new fields
on the same rows; it never calls another role for data. `process_partition(k)` handles every row of
partition k (used directly by the colocated schedule); `run(steps)` loops over partitions (async).
"""

from __future__ import annotations

import os
import time

import torch

from relax.bus import Batch, Bus
from relax.config import ExperimentConfig
from relax.metrics.telemetry import SpanRecorder
from relax.weights.store import fetch_weights

POLL_S = 0.005


class Role:
    name = "role"
    task = ""  # bus consumption task name
    fields: list[str] = []
    whole_groups = False

    def __init__(self, cfg: ExperimentConfig, bus: Bus, telemetry, weights, threads: int):
        torch.set_num_threads(threads)
        self.cfg = cfg
        self.bus = bus
        self.weights = weights
        self.rec = SpanRecorder(self.name, telemetry)
        self.rows_per_step = cfg.rows_per_step

    def pid(self) -> int:
        return os.getpid()

    def ready(self) -> bool:
        return True

    def run(self, steps: int) -> None:
        for k in range(steps):
            self.process_partition(k)
        self.rec.flush()

    def process_partition(self, k: int) -> int:
        """Consume every row of partition k for this role's task; returns rows handled."""
        done = 0
        while done < self.rows_per_step:
            batch = self.bus.fetch(k, self.task, self.fields, max_rows=self.rows_per_step - done,
                                   whole_groups=self.whole_groups)
            if batch is None:
                time.sleep(POLL_S)
                continue
            with self.rec.span(self.task, step=k, rows=batch.size):
                self.bus.write(batch, self.compute(batch))
            done += batch.size
        self.rec.flush()
        return done

    def compute(self, batch: Batch) -> dict:
        raise NotImplementedError


class ModelRole(Role):
    """A role holding a copy of the policy model, kept in sync with the Actor's published weights."""

    def __init__(self, cfg, bus, telemetry, weights, threads):
        super().__init__(cfg, bus, telemetry, weights, threads)
        from relax.models import build_model

        self.model, self.tokenizer = build_model(cfg.model, cfg.seed)
        self.version = -1

    def sync_weights(self, min_version: int | None = None) -> float:
        """Load the newest published weights (waiting for `min_version` if given); returns seconds spent."""
        t0 = time.time()
        version, state = fetch_weights(self.weights, self.version, min_version)
        if state is not None:
            self.load_state(state, version)
        return time.time() - t0

    def load_state(self, state: dict, version: int) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.data.copy_(state[name])
        self.version = version
