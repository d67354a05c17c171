"""Where a run's metrics go: one `Reporter` the controller reports to, fanning out to the configured sinks.

Contract of a sink (any object with these three methods; `metrics.sinks` in the config picks them):
- `step(step, metrics)`: one training step's scalars (name -> float), called once per step, in order,
  while the run goes on (the controller's poll), not only at the end.
- `event(kind, payload)`: something that happened between steps: a recovery ("recovery"), a scale
  operation ("scale"), a fired fault ("fault").
- `close()`: the run ended (or failed); flush and release files. Called once.
A sink that raises is reported once on stderr and dropped; it never stops training.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Protocol


class Sink(Protocol):
    def step(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def event(self, kind: str, payload: Mapping) -> None: ...

    def close(self) -> None: ...


class Reporter:
    """Fans every call out to its sinks; a sink that fails is reported once and dropped (training goes on)."""

    def __init__(self, sinks: Mapping[str, Sink]):
        self.sinks = dict(sinks)
        self.failed: dict[str, str] = {}  # sink name -> the error that dropped it (summary.json reports it)

    def _each(self, method: str, *args) -> None:
        for name, sink in list(self.sinks.items()):
            try:
                getattr(sink, method)(*args)
            except Exception as err:  # noqa: BLE001 -- any sink failure (disk full, bad dir) must not stop training
                self.failed[name] = f"{type(err).__name__}: {err}"
                del self.sinks[name]
                print(f"relax: metrics sink {name!r} failed and is off for the rest of the run: {err}",
                      file=sys.stderr)

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._each("step", step, metrics)

    def event(self, kind: str, payload: Mapping) -> None:
        self._each("event", kind, payload)

    def close(self) -> None:
        self._each("close")
