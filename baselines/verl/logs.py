"""veRL's console metrics into the results schema.

With `trainer.logger=[console]` veRL 0.9.1 prints one line per `Tracking.log(data, step)` call
(verl/utils/logger/aggregate_logger.py, concat_dict_to_str): `step:N - key:value - key:value ...`, every
numeric value through pprint.pformat, so numpy scalars read `np.float64(0.5)`. Ray prefixes a worker's
lines with `(TaskRunner pid=...)`, and fully async logs one step in two lines (timings, then the aggregated
metrics), so lines of the same step are merged.

Metric names (verl/trainer/ppo/metric_utils.py and the trainers): timing_s/step is the step's wall time;
critic/score/mean the mean task score; perf/total_num_tokens counts prompt + response tokens, so
samples = total / (prompt_length/mean + response_length/mean). timing_s/gen is the trainer waiting for
rollout (the generation itself when colocated); the weight sync is timing_s/update_weights (colocate),
timing_s/sync_rollout_weights (one-step-off) or timing_s/param_sync (fully async).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from baselines.common import to_frame

if TYPE_CHECKING:  # pandas (the `analysis` extra) is imported by to_frame, once a log is parsed
    import pandas as pd

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")
_VALUE = re.compile(r"^(?:[\w.]+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf))\)?$")
_SYNC = ("timing_s/update_weights", "timing_s/sync_rollout_weights", "timing_s/param_sync")


def parse_log(path: str | Path) -> pd.DataFrame:
    """One row per training step of a veRL console log (see the module docstring for the columns)."""
    steps: dict[int, dict[str, float]] = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        found = _LINE.search(_ANSI.sub("", line))
        if found:
            metrics = steps.setdefault(int(found[1]), {})
            for item in found[2].split(" - "):
                key, _, raw = item.rpartition(":")
                value = _VALUE.match(raw.strip())
                if key and value:
                    metrics[key.strip()] = float(value[1])
    # A validation-only step (val_before_train) has no training metrics.
    return to_frame({k: m for k, m in steps.items() if "timing_s/step" in m}, _schema, str(path))


def _schema(m: dict[str, float]) -> dict[str, float]:
    per_sample = m.get("prompt_length/mean", math.nan) + m.get("response_length/mean", math.nan)
    samples = m.get("perf/total_num_tokens", math.nan) / per_sample if per_sample else math.nan
    return {
        "step_time_s": m.get("timing_s/step", math.nan),
        "reward_mean": m.get("critic/score/mean", math.nan),
        "samples": samples,
        "tokens": samples * m.get("response_length/mean", math.nan),
        "trainer_wait_s": m.get("timing_s/gen", math.nan),
        "weight_sync_s": next((m[k] for k in _SYNC if k in m), math.nan),
    }
