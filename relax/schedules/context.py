"""What a schedule and the supervisor see of a run: the narrow context the controller hands them.

Neither needs the controller itself: the config and run folder, the bus and telemetry, the names of the
roles this run starts and their live handles (the supervisor puts restarted ones in their place), the step
records seen so far and the hook that polls telemetry for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


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
