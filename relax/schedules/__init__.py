"""Schedules: the order in which the roles run, selected by the config's `schedule` field.

- `relax`: our service schedule (relax/schedules/relax.py: the supervised async loop and the colocate loop).
- `verl`, `openrlhf`: EMULATED schedules. They run the documented dataflow of veRL's one-step-off-policy
  trainer and of OpenRLHF's async trainer with our kernels (same model, engine, trainer, bus), so the
  difference measured at CPU scale is the schedule's and nothing else. Results carry `schedule` and
  `emulated: true`; figures and tables label them "emulated".

Each schedule module exposes `LABEL`, `EMULATED`, `check(cfg)` (raises ConfigError naming the field),
`role_names(cfg, names)` (the services it starts, of the roles the config enables) and
`run(ctx, supervisor, bar)` (drives one run; `ctx` is relax.schedules.context.RunContext, the supervisor has
started the roles). Span names on the trainer's critical path are listed in `relax.schedules.spans`.

How an emulated schedule drives a role: the loop a role runs for it (veRL's trainer, OpenRLHF's generator
and trainer) stays in the schedule module, in `LOOPS` by role name, and the role's one named entry
`run_schedule(*args)` (relax/roles/base.py) imports its configured schedule and runs `LOOPS[role]` in the
role's own process. Small named role methods composed from the driver were the other way; they would put
a driver round trip between phases the emulated trainer runs back to back, ship whole batches through the
driver or split the Actor's step around OpenRLHF's broadcast under the vLLM lock, and so change the times
the emulation exists to measure. The loop body reaches the role's trainer, bus client and span recorder
in-process, as the emulated systems' trainer does; a role runs no code it was sent, only its schedule's.
Where a loop needs another role it calls a named method (the veRL barrier: `Rollout.load_weights`).
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


def role_names(cfg: ExperimentConfig) -> list[str]:
    """The roles a run of `cfg` starts: those its config enables, in dependency order (relax.roles.registry),
    less those its schedule does without."""
    from relax.roles.registry import role_order  # the role classes pull in torch and Ray: spans stays light

    return get_schedule(cfg).role_names(cfg, role_order(cfg))
