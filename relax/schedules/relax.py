"""The relax schedule: Relax's own service schedule (not emulated).

async: every role loops over partitions on its own core share, joined only by the bus; the staleness gate
bounds how far rollout runs ahead. colocate: rollout and training alternate on shared cores, with the
engine put to sleep around training. Both loops live on the Controller (`run_async`, `run_colocate`).
"""

from __future__ import annotations

LABEL = "relax"
EMULATED = False


def check(cfg) -> None:
    return None


def role_names(cfg, names: list[str]) -> list[str]:
    return names


def run(controller, bar) -> None:
    (controller.run_async if controller.cfg.mode == "async" else controller.run_colocate)(bar)
