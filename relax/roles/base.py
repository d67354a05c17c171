"""What every role (service) shares: its process setup, the bus, spans, and the partition loop.

A role is a Ray actor in its own process. It reads the fields it needs from the bus and writes new fields
on the same rows; it never calls another role for data. `process_partition(k)` handles every row of
partition k (used directly by the colocated schedule); `run(steps)` loops over partitions (async).

Each role class declares, for a config, whether it runs (`enabled(cfg)`), the bus fields it reads
(`reads(cfg)`) and those it writes (`writes(cfg)`), and the per-partition calls the colocate loop makes on it
(`phases`); a `train_partition` phase reads `train_reads(cfg)` and writes nothing. The role set and the
colocate order follow from these declarations (relax/roles/registry.py).
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

import torch

from relax.bus import WAIT_S, Batch, Bus
from relax.config import ExperimentConfig
from relax.fault.boot import BootClock
from relax.fault.checkpoint import WEIGHTS
from relax.fault.redelivery import produced
from relax.metrics.telemetry import SpanRecorder


class Role:
    name = "role"
    task = ""  # bus consumption task name
    fields: list[str] = []  # the fields it reads under every config (`reads(cfg)` adds the optional ones)
    outputs: list[str] = []  # the fields it writes: a restarted role skips rows that already have them
    whole_groups = False
    phases: tuple[str, ...] = ("process_partition",)  # the colocate loop's calls on it per partition, in order
    dcs_member = {"serve": False, "follow": False, "trainer": False}  # its part in the DCS (relax.weights)

    def __init__(self, cfg: ExperimentConfig, bus: Bus, telemetry, weights, threads: int, replica: int | None = None):
        self.boot = BootClock()  # where a (re)start's seconds go (relax/fault/boot.py)
        torch.set_num_threads(threads)
        self.cfg = cfg
        self.bus = bus
        self.weights = weights  # the DCS handle: weights, and this process's registration + heartbeat
        self.replica = replica
        self.rec = SpanRecorder(self.name, telemetry)
        self.rows_per_step = cfg.rows_per_step
        self.fields, self.outputs = self.reads(cfg), self.writes(cfg)
        self.weights.join(self.name, replica, **self.membership(cfg))
        self.boot.mark("dcs_join")

    # --- declarations (class-level: read by the registry without starting the role) ----------------------
    @classmethod
    def enabled(cls, cfg: ExperimentConfig) -> bool:
        """Whether a run of `cfg` starts this role."""
        return True

    @classmethod
    def reads(cls, cfg: ExperimentConfig) -> list[str]:
        """The bus fields this role fetches under `cfg`."""
        return list(cls.fields)

    @classmethod
    def writes(cls, cfg: ExperimentConfig) -> list[str]:
        """The bus fields this role writes under `cfg`."""
        return list(cls.outputs)

    @classmethod
    def membership(cls, cfg: ExperimentConfig) -> dict:
        """Its part in the DCS under `cfg` (`DCS.join`'s serve / follow / trainer); `relax profile` reads it too."""
        return dict(cls.dcs_member)

    @classmethod
    def train_reads(cls, cfg: ExperimentConfig) -> list[str]:
        """The fields its `train_partition(k)` phase reads (a role with that phase declares them)."""
        return []

    def pid(self) -> int:
        return os.getpid()

    def ready(self) -> bool:
        return True

    def backend(self) -> str:
        """What computes this role's work (summary.json `backends`)."""
        return "cpu"

    def boot_phases(self) -> dict[str, float]:
        return self.boot.phases()

    def bus_calls(self) -> dict[str, int]:
        """This process's bus operations so far, by kind (relax.bus.Bus.calls)."""
        return dict(self.bus.calls)

    def recovery_info(self, ckpt_dir: str | None = None) -> dict:
        """What a restarted instance recovered and how (the supervisor records it)."""
        return {"boot": self.boot.phases(), "boot_t0": self.boot.started()}

    def run(self, steps: int, start: int = 0, recover: bool = False) -> None:
        for k in range(start, steps):
            self.process_partition(k, recover)
        self.rec.flush()

    def run_schedule(self, *args):
        """This role's part of the emulated schedule `cfg.schedule`, run in this process: the loop is the
        schedule module's `LOOPS[role name]` (relax/schedules/), called with this role and `args`."""
        schedule = importlib.import_module(f"relax.schedules.{self.cfg.schedule}")
        return schedule.LOOPS[self.name](self, *args)

    def process_partition(self, k: int, recover: bool = False) -> int:
        """Consume every row of partition k for this role's task; returns rows handled. `recover`: rows of k
        may be handed out again after a restart; those already carrying this role's outputs are skipped."""
        skip = produced(self.bus, k, self.outputs) if recover else set()
        done = len(skip)
        while done < self.rows_per_step:
            batch = self.bus.fetch(k, self.task, self.fields, max_rows=self.rows_per_step - done,
                                   whole_groups=self.whole_groups, wait=WAIT_S)
            if batch is not None and skip:
                keep = [i for i, g in enumerate(batch.indexes) if g not in skip]
                batch = batch.select(keep) if keep else None
            if batch is None:
                continue
            # `fields`: what this role actually received (field-level storage: e.g. Reward never gets media).
            with self.rec.span(self.task, step=k, rows=batch.size, fields=sorted(batch.data)):
                self.bus.write(batch, self.compute(batch))
            done += batch.size
        self.rec.flush()
        return done

    def compute(self, batch: Batch) -> dict:
        raise NotImplementedError


class ModelRole(Role):
    """A role holding a copy of the policy model, kept in sync with the Actor's published weights."""

    dcs_member = {"serve": True, "follow": False, "trainer": False}

    def __init__(self, cfg, bus, telemetry, weights, threads, replica=None):
        super().__init__(cfg, bus, telemetry, weights, threads, replica)
        from relax.models import build_model

        self.model, self.tokenizer = build_model(cfg.model, cfg.seed)
        self.version = -1
        self.boot.mark("model_build")

    def sync_weights(self, min_version: int | None = None, exact: int | None = None, block: bool = True) -> float:
        """Load the newest published weights (waiting for `min_version` if given; `exact`: that version);
        returns seconds spent. `block=False` loads only a version already here (a follower's prefetch)."""
        t0 = time.time()
        self.weights.sync(self.version, self.load_state, min_version=min_version, exact=exact, block=block)
        return time.time() - t0

    def weight_version(self) -> int:
        return self.version

    def backend(self) -> str:
        from relax.emulate import emulator

        emu = emulator(self.cfg)
        if emu is not None:
            gpus = getattr(emu.target.resources, self.name).gpus
            return f"EMULATED {emu.target.training.trainer} on {gpus:g}x {emu.cost.hw.name} (tiny torch model)"
        return "torch (transformers model)"

    def recovery_info(self, ckpt_dir: str | None = None) -> dict:
        """How this instance got its weights (DCS peer, seconds, bytes), and what reloading the same amount
        of weights from the Actor's disk checkpoint costs here, for comparison (not used)."""
        info = {f"dcs_{k}": v for k, v in self.weights.last_transfer.items()}
        info.update(boot=self.boot.phases(), boot_t0=self.boot.started())
        path = Path(ckpt_dir or "") / WEIGHTS
        if ckpt_dir and path.exists():
            scratch = {n: torch.empty_like(p) for n, p in self.model.named_parameters()}

            def reload() -> float:
                t0 = time.time()
                state = torch.load(path, weights_only=True)
                for n, t in scratch.items():
                    t.copy_(state[n])
                return time.time() - t0

            # From the page cache (the Actor just wrote the file); the supervisor measures a cold read later,
            # off the recovery path (relax.fault.supervisor.disk_cold_reload).
            info.update(disk_seconds=reload(), disk_bytes=path.stat().st_size)
        return info

    def load_state(self, state: dict, version: int) -> None:
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.data.copy_(state[name])
        self.version = version
