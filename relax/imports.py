"""What a process pays to start: tensordict without torch._dynamo.

Every role process, TransferQueue's controller and storage, and the driver import tensordict (the bus's row
container). At import, tensordict wraps a few functorch functions with `torch.compiler.allow_in_graph` and
`assume_constant_result`, and both import `torch._dynamo`: about 1.7 s of CPU out of a role process's ~5 s of
imports (measured on 2 cores). Processes that build a model pay it anyway (transformers' masking_utils imports
from torch._dynamo); the others (Reward, Advantages, TransferQueue's controller and storage, the emulated
schedules' loops) are spared it at every run's start and every restart. Relax never compiles through
tensordict, so those two markers (which only tell dynamo how to trace the wrapped functions) are identities
while tensordict imports, and the real ones are back as soon as it has. A later `torch.compile` still works; it
traces into those few wrappers instead of treating them as opaque.

`install()` adds a finder that does this at tensordict's first import, in whatever process imports it; it costs
nothing in processes that never do (the bus coordinator, the DCS coordinator, the GroupQueue). `relax` installs
it on import, and `RaySession` names it as Ray's worker setup hook, so TransferQueue's own actors (which never
import relax) get it too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_MARKERS = ("allow_in_graph", "assume_constant_result")


class _Loader(importlib.abc.Loader):
    """tensordict's own loader, run with the two dynamo markers as identities."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        import torch.compiler

        saved = {name: getattr(torch.compiler, name) for name in _MARKERS}
        for name in _MARKERS:
            setattr(torch.compiler, name, lambda fn: fn)
        try:
            self.loader.exec_module(module)
        finally:
            for name, fn in saved.items():
                setattr(torch.compiler, name, fn)
            module.__loader__ = module.__spec__.loader = self.loader  # as if imported plainly


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tensordict":
            return None
        uninstall()  # once: the spec below comes from the finders after this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Import tensordict without torch._dynamo in this process, unless it is imported already. Idempotent."""
    if "tensordict" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
