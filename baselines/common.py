"""What the veRL and OpenRLHF translators share: the launch plan, the GPU arithmetic, the checks that a
config can be run by another framework at all, and the results-schema frame their log parsers fill.

Numbers the experiment schema (`relax.config`) has no field for are constants here, each with its source.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from relax.config import ExperimentConfig

if TYPE_CHECKING:
    import pandas as pd

# An H800 HGX node holds 8 GPUs; the paper's 16 GPUs are 2 such nodes.
GPUS_PER_NODE = 8
# Prompt budget: the Relax Qwen3-4B 16xgpu script sizes --max-tokens-per-gpu 9216 = 8192 response + 1024.
MAX_PROMPT_TOKENS = 1024
# Relax Qwen3-4B scripts: --tensor-model-parallel-size 2 (Megatron actor, reference and actor_fwd).
TRAIN_TP = 2
# Relax Qwen3-4B scripts: --sglang-mem-fraction-static 0.8 (the rollout engine's share of GPU memory).
ROLLOUT_MEM_FRACTION = 0.8
# What the reward file shipped with every baseline launch is called (see reward_math_verify.py).
REWARD_FILE = "reward_math_verify.py"

# Columns of results/<experiment>/<profile>/<run>/metrics.jsonl (DESIGN.md section 7) a framework log can fill;
# a metric the framework does not log stays NaN.
SCHEMA_COLUMNS = ["step", "wall_time_s", "step_time_s", "reward_mean", "samples", "tokens",
                  "trainer_wait_s", "weight_sync_s"]


@dataclass(frozen=True)
class LaunchPlan:
    """A framework's own launch: argv, extra environment, and files (name -> text) the argv refers to."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    config_files: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command as one shell-quoted line, environment assignments first."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join(env + [shlex.join(self.command)])

    def script(self, header: str, log_name: str = "train.log") -> str:
        """A bash launcher that runs the command from its own folder and tees the console to `log_name`."""
        lines = ["#!/usr/bin/env bash", *(f"# {h}" for h in header.splitlines()), "set -euo pipefail",
                 'cd "$(dirname "$0")"', *(f"export {k}={shlex.quote(v)}" for k, v in self.env.items())]
        # One line per flag with its values (or per hydra override); the interpreter and module lead.
        groups: list[list[str]] = [[]]
        for arg in self.command:
            if arg.startswith("--") or "=" in arg:
                groups.append([])
            groups[-1].append(shlex.quote(arg))
        args = " \\\n    ".join(" ".join(g) for g in groups)
        return "\n".join(lines + [f"{args} \\\n    2>&1 | tee {shlex.quote(log_name)}", ""])


def default_out(framework: str, cfg: ExperimentConfig, mode: str) -> Path:
    """Where `relax baseline` writes a launch unless told otherwise (absolute: the launch names its files)."""
    return Path(f"results/baselines/{framework}/{cfg.name}/{mode}").resolve()


def reward_source() -> str:
    """The reward file every baseline launch ships (task.reward: math_verify)."""
    return (Path(__file__).parent / REWARD_FILE).read_text()


def gpus(value: float, name: str) -> int:
    if value != int(value):
        raise ValueError(f"{name}: a framework launch needs whole GPUs, got {value}")
    return int(value)


def total_gpus(cfg: ExperimentConfig) -> int:
    """GPUs of the whole run: colocated roles share one pool; async roles each have their own."""
    res = cfg.resources
    if cfg.mode == "colocate":
        if res.rollout.gpus != res.actor.gpus:
            raise ValueError("resources: colocate mode time-shares one pool, so rollout.gpus must equal actor.gpus")
        return gpus(res.actor.gpus, "resources.actor.gpus")
    return sum(gpus(getattr(res, r).gpus, f"resources.{r}.gpus") for r in type(res).model_fields)


def nodes(n: int, what: str) -> tuple[int, int]:
    """(nodes, GPUs per node) for a pool of n GPUs on GPUS_PER_NODE-GPU nodes."""
    if n < 1:
        raise ValueError(f"{what}: needs at least one GPU")
    count = math.ceil(n / GPUS_PER_NODE)
    if n % count:
        raise ValueError(f"{what}: {n} GPUs do not split evenly over {count} nodes of {GPUS_PER_NODE}")
    return count, n // count


def rollout_tp(cfg: ExperimentConfig) -> int:
    """GPUs per rollout engine: the rollout pool over rollout.replicas (Relax: --rollout-num-gpus-per-engine)."""
    pool = gpus(cfg.resources.rollout.gpus, "resources.rollout.gpus")
    if pool < 1 or pool % cfg.rollout.replicas:
        raise ValueError(f"rollout.replicas: {cfg.rollout.replicas} engines cannot split {pool} rollout GPUs evenly")
    return pool // cfg.rollout.replicas


def check(cfg: ExperimentConfig, framework: str, mode: str, modes: dict[str, str]) -> None:
    """Refuse what the translators cannot express faithfully, naming the field."""
    if mode not in modes:
        raise ValueError(f"{framework}: unsupported mode {mode!r}; choose one of {sorted(modes)}")
    if modes[mode] != cfg.mode:
        raise ValueError(f"{framework} --mode {mode} runs a {modes[mode]} schedule, but the config's mode is {cfg.mode!r}")
    if cfg.model.kind != "hf":
        raise ValueError(f"model.kind: {framework} loads a Hugging Face folder; set model.kind: hf and model.path")
    if cfg.task.name != "dapo_math" or "path" not in cfg.task.params:
        raise ValueError(f"task: {framework} reads a local file; use task.name: dapo_math with task.params.path")
    if cfg.task.reward != "math_verify":
        raise ValueError(f"task.reward: only math_verify has a {framework} reward function, got {cfg.task.reward!r}")
    if cfg.algorithm.advantage != "grpo" or cfg.algorithm.policy_loss != "ppo":
        raise ValueError("algorithm: the baseline launches map advantage 'grpo' with policy_loss 'ppo' only")


def to_frame(steps: dict[int, dict[str, float]], schema: Callable[[dict[str, float]], dict[str, float]],
             source: str) -> pd.DataFrame:
    """One row per logged step: SCHEMA_COLUMNS (`schema(metrics)` fills what it can; wall_time_s is the
    running sum of step_time_s), then every raw metric of that step under the framework's own name."""
    import pandas as pd  # the `analysis` extra: `relax baseline --dry-run` runs without it

    if not steps:
        raise ValueError(f"{source}: no training-step metrics found")
    rows = []
    for step in sorted(steps):
        row = dict.fromkeys(SCHEMA_COLUMNS, math.nan) | schema(steps[step]) | {"step": step}
        rows.append(row | {k: v for k, v in steps[step].items() if k not in row})
    frame = pd.DataFrame(rows)
    frame["wall_time_s"] = frame["step_time_s"].cumsum()
    return frame
