"""OpenRLHF's console metrics into the results schema.

OpenRLHF 0.11.2 logs each training step's whole status dict on stdout through its own logger
(openrlhf/utils/logging_utils.py: `LEVEL MM-DD HH:MM:SS file.py:line] message`): the colocated trainer
(trainer/ppo_trainer.py) as `✨ Global step N: {...}`, the async one (trainer/ppo_trainer_async.py) as
`Global step N: {...}`, the dict a Python repr whose values may be wrapped (`tensor(0.5)`,
`np.float64(0.5)`); Ray prefixes the lines with `(PPOTrainer pid=...)`. The same dict goes to wandb and
TensorBoard under `train/<key>`, so the console is the one record every run has. (The tqdm postfix only
carries the actor's per-micro-batch losses.)

Metric names: timing/step_total is the step's wall time (async: including the wait for the queue);
rollout/reward_mean, rollout/num_samples and rollout/response_length_mean describe the step's batch;
timing/broadcast is the weight sync to vLLM. The trainer waits for data for whatever timing/step_total
leaves after timing/make_experience, timing/ppo_train and timing/broadcast (the generation when colocated).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from baselines.common import to_frame

if TYPE_CHECKING:  # pandas (the `analysis` extra) is imported by to_frame, once a log is parsed
    import pandas as pd

_LINE = re.compile(r"Global step (\d+): \{(.*)\}\s*$")
_ITEM = re.compile(r"'([^']+)':\s*(?:[\w.]+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|nan|inf))")
_WORK = ("timing/make_experience", "timing/ppo_train", "timing/broadcast")


def parse_log(path: str | Path) -> pd.DataFrame:
    """One row per training step of an OpenRLHF console log (see the module docstring for the columns)."""
    steps: dict[int, dict[str, float]] = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        found = _LINE.search(line)
        if found:
            steps[int(found[1])] = {k: float(v) for k, v in _ITEM.findall(found[2])}
    return to_frame(steps, _schema, str(path))


def _schema(m: dict[str, float]) -> dict[str, float]:
    step = m.get("timing/step_total", math.nan)
    samples = m.get("rollout/num_samples", math.nan)
    return {
        "step_time_s": step,
        "reward_mean": m.get("rollout/reward_mean", math.nan),
        "samples": samples,
        "tokens": samples * m.get("rollout/response_length_mean", math.nan),
        "trainer_wait_s": step - sum(m.get(k, math.nan) for k in _WORK),
        "weight_sync_s": m.get("timing/broadcast", math.nan),
    }
