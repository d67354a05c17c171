"""Preflight: every check a run can fail that the schema alone cannot make, run before the run folder exists
and before Ray starts. `relax run` and `relax validate` both call `preflight`, so validate accepts exactly what
run accepts; each failure is a `ConfigError` naming the field (the CLI exits 2 with it).

Checked: the schedule suits the config (e.g. schedule=verl needs mode=async), the rollout engine can start
here, the algorithm's registry names and `algorithm.params` keys, finite numbers inside free-form params,
the task's name, params and data files (both splits), the alerts' Apprise URLs, the API port, the packages of
the metrics sinks, and the prompt length against the model's `max_position` (tiny char-level models; an hf
model's limit is its own config's).
"""

from __future__ import annotations

import math
import socket
from typing import Any

from relax.config import ConfigError, ExperimentConfig

PROMPTS_CHECKED = 16  # per split: reasoning-gym rows cost up to ~50 ms each to generate (a sample: rows of one
# generator have similar lengths)


def preflight(cfg: ExperimentConfig, api_port: int | None = None) -> None:
    from relax.algorithms import check_config
    from relax.engines.remote import check_engine_available
    from relax.schedules import get_schedule

    get_schedule(cfg)  # raises ConfigError naming the field
    try:
        check_engine_available(cfg)
    except RuntimeError as err:
        raise ConfigError(str(err)) from None
    try:
        check_config(cfg.algorithm)  # its errors name the field
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in ("algorithm.params", "task.params"):
        section, field = name.split(".")
        _finite(getattr(getattr(cfg, section), field), name)
    _check_task(cfg)
    try:
        from relax.metrics.alerts import check_targets

        check_targets(cfg.alerts)  # each Apprise URL parses
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _check_sinks(cfg)
    if api_port is not None:
        check_port(api_port)


def _finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(v, f"{where}.{i}")


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """--api-port: 0 (any free port) or a port this machine lets the API listen on now."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--api-port: {port} is not a TCP port (0-65535; 0 picks a free one)")
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise ConfigError(f"--api-port: cannot listen on {host}:{port}: {err.strerror or err}") from None


def _check_sinks(cfg: ExperimentConfig) -> None:
    from relax.metrics.sinks import missing_package

    for sink in cfg.metrics.sinks:
        package = missing_package(sink)
        if package is not None:
            raise ConfigError(f"metrics.sinks: the {sink} sink needs the '{package}' package, which is not installed "
                              f"here (pip install -e '.[ops]' installs every sink's package; or leave {sink} out)")


def _check_task(cfg: ExperimentConfig) -> None:
    from relax.tasks import make_task

    tokenizer = None
    if cfg.task.kind == "text" and cfg.model.kind in ("tiny_qwen3", "tiny_qwen3_moe"):
        from relax.models.tokenizer import CharTokenizer

        tokenizer = CharTokenizer()
    for split in ("train", "eval"):
        try:
            task = make_task(cfg.task, cfg.seed, split)
        except (ValueError, KeyError, TypeError, OSError) as err:
            msg = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            raise ConfigError(msg if msg.startswith("task.") else f"task ({cfg.task.name}, {split}): {msg}") from None
        if tokenizer is None:
            continue
        for i in range(min(len(task), PROMPTS_CHECKED)):
            n = len(tokenizer.encode(task[i].prompt))
            if n + cfg.rollout.max_new_tokens > cfg.model.max_position:
                raise ConfigError(f"model.max_position: {split} prompt {i} is {n} tokens, which with "
                                  f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} exceeds "
                                  f"model.max_position={cfg.model.max_position}")
