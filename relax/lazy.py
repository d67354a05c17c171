"""PEP 562 lazy exports: a package names where each public name lives and imports that submodule on first use,
so a process that needs only a light submodule (the bus gate, the DCS coordinator) never pays for the heavy ones."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package` resolving each name in `homes` from `package.<its submodule>`."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home}"), name)

    return __getattr__
