"""Where a run's metrics go: one `Reporter` the controller reports to, fanning out to the configured sinks.

Contract of a sink (any object with these three methods; `metrics.sinks` in the config picks them):
- `step(step, metrics)`: one training step's scalars (name -> float), called once per step, in order,
  while the run goes on (the controller's poll), not only at the end.
- `event(kind, payload)`: something that happened between steps: a recovery ("recovery"), a scale
  operation ("scale"), a fired fault ("fault").
- `close()`: the run ended (or failed); flush and release files. Called once.
A sink that raises is reported once on stderr and dropped; it never stops training.

A step's metrics are the controller's metrics.jsonl row (less `step`): numbers, and per-role dicts of numbers
(`busy_s`, `busy_share`); `scalars()` flattens them to `busy_share/rollout` for sinks that take plain names.
Each sink is one small module here (jsonl_sink, tensorboard_sink, wandb_sink, mlflow_sink), imported only
when `metrics.sinks` names it, so a run without W&B never imports wandb. `build_reporter(cfg, folder)` makes
them; a sink that cannot even start (a folder it cannot create) is reported and dropped the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from relax.config import ExperimentConfig
    from relax.run_folder import RunFolder

# sink name -> (module under relax.metrics, the package it needs: checked by preflight, named in its error)
SINKS = {"jsonl": ("jsonl_sink", None), "tensorboard": ("tensorboard_sink", "tensorboard"),
         "wandb": ("wandb_sink", "wandb"), "mlflow": ("mlflow_sink", "mlflow")}


class Sink(Protocol):
    def step(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def event(self, kind: str, payload: Mapping) -> None: ...

    def close(self) -> None: ...


class Reporter:
    """Fans every call out to its sinks; a sink that fails is reported once and dropped (training goes on)."""

    def __init__(self, sinks: Mapping[str, Sink]):
        self.sinks = dict(sinks)
        self.failed: dict[str, str] = {}  # sink name -> the error that dropped it (summary.json reports it)
        # sink name -> wall seconds spent inside its calls (summary.json `metrics_sinks_s`: what the sinks cost
        # the driver's poll; `relax bench sinks` measures their cost to step time side by side)
        self.seconds: dict[str, float] = defaultdict(float)

    def drop(self, name: str, err: BaseException) -> None:
        self.failed[name] = f"{type(err).__name__}: {err}"
        self.sinks.pop(name, None)
        print(f"relax: metrics sink {name!r} failed and is off for the rest of the run: {type(err).__name__}: {err}",
              file=sys.stderr)

    def _each(self, method: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            t0 = time.perf_counter()
            try:
                getattr(sink, method)(*args)
            except Exception as err:  # noqa: BLE001 -- any sink failure (disk full, bad dir) must not stop training
                self.drop(name, err)
            finally:
                self.seconds[name] += time.perf_counter() - t0

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._each("step", step, metrics)

    def event(self, kind: str, payload: Mapping) -> None:
        self._each("event", kind, payload)

    def close(self) -> None:
        """Once (a second call, from a `finally` after a normal close, does nothing)."""
        self._each("close")
        self.sinks = {}


def scalars(metrics: Mapping) -> Iterator[tuple[str, float]]:
    """(name, value) for every number in a step's metrics; a dict of numbers gives `name/key` (busy_share/actor).
    NaN and inf pass through (a sink shows a diverged loss as it is); strings, None and lists are left out."""
    for name, value in metrics.items():
        if isinstance(value, Mapping):
            for key, v in value.items():
                if isinstance(v, (int, float)):
                    yield f"{name}/{key}", float(v)
        elif isinstance(value, (int, float)):
            yield name, float(value)


def missing_package(sink: str) -> str | None:
    """The package `sink` needs when it is not installed here (preflight names it), else None."""
    package = SINKS[sink][1]
    return package if package is not None and importlib.util.find_spec(package) is None else None


def build_reporter(cfg: ExperimentConfig, folder: RunFolder) -> Reporter:
    """A Reporter over `cfg.metrics.sinks`, each writing inside the run folder (relax/run_folder.py names where)."""
    reporter = Reporter({})
    for name in cfg.metrics.sinks:
        try:
            module = importlib.import_module(f"relax.metrics.{SINKS[name][0]}")
            reporter.sinks[name] = module.make(cfg, folder)
        except Exception as err:  # noqa: BLE001 -- a sink that cannot start is dropped like one that fails later
            reporter.drop(name, err)
    return reporter
