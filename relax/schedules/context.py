"""What a schedule and the supervisor see of a run: the narrow context the controller hands them.

Neither needs the controller itself: the config and run folder, the bus and telemetry, the names of the
roles this run starts and their live handles (the supervisor puts restarted ones in their place), the step
records seen so far and the hook that polls telemetry for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


class RunStopped(RuntimeError):
    """The run ended before its planned steps and kept what it did in `run_dir`: a role stopped it (e.g.
    training.max_nonfinite_steps) or an operator asked (`POST /run/stop`, `requested`)."""

    def __init__(self, message: str, run_dir: Path, requested: bool = False):
        super().__init__(f"{message} (results so far in {run_dir})")
        self.run_dir, self.requested = run_dir, requested


@dataclass
class RunContext:
    cfg: Any  # ExperimentConfig
    run_dir: Path
    bus: Any  # relax.bus.Bus
    telemetry: Any  # the Telemetry actor's handle
    role_names: list[str]  # the roles this run starts, in dependency order (relax.schedules.role_names)
    roles: dict[str, Any] = field(default_factory=dict)  # name -> live Ray handle ("rollout": replica 0)
    records: dict[int, dict] = field(default_factory=dict)  # step -> its record, as `poll` finds them
    poll: Callable[[Any], None] = lambda bar: None  # poll(bar): new step records, progress bar, memory
    step_extra: dict[int, dict] = field(default_factory=dict)  # step -> extra metrics.jsonl fields (colocate)
    live: dict = field(default_factory=dict)  # the poll's newest view: "row", the last step's metrics.jsonl row
    stop_reason: str | None = None  # set by the control API's thread (POST /run/stop); the schedule's loop obeys

    def obey_stop(self) -> None:
        """Raise RunStopped once an operator asked the run to stop: every schedule's driver loop calls it, so the
        run ends between two polls and the controller keeps the steps done (relax/controller.py)."""
        if self.stop_reason is not None:
            raise RunStopped(self.stop_reason, self.run_dir, requested=True)
