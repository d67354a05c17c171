"""Schedules: the order in which the roles run, selected by the config's `schedule` field.

- `relax`: our service schedule (the controller's async and colocate loops).
- `verl`, `openrlhf`: EMULATED schedules. They run the documented dataflow of veRL's one-step-off-policy
  trainer and of OpenRLHF's async trainer with our kernels (same model, engine, trainer, bus), so the
  difference measured at CPU scale is the schedule's and nothing else. Results carry `schedule` and
  `emulated: true`; figures and tables label them "emulated".

Each schedule module exposes `LABEL`, `EMULATED`, `check(cfg)` (raises ConfigError naming the field),
`role_names(cfg, names)` (the services it starts) and `run(controller, bar)` (drives one run).
Span names on the trainer's critical path are listed in `relax.schedules.spans`.
"""

from __future__ import annotations

import importlib

from relax.config import ConfigError, ExperimentConfig

SCHEDULES = ("relax", "verl", "openrlhf")


def get_schedule(cfg: ExperimentConfig):
    """The schedule module for `cfg.schedule`, after checking the config suits it."""
    if cfg.schedule not in SCHEDULES:
        raise ConfigError(f"schedule: unknown schedule '{cfg.schedule}' (one of {', '.join(SCHEDULES)})")
    module = importlib.import_module(f"relax.schedules.{cfg.schedule}")
    module.check(cfg)
    return module


def is_emulated(schedule: str) -> bool:
    return schedule != "relax"
