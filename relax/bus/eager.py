"""Import tensordict (TransferQueue's row container) without torch's compiler stack.

At import, tensordict passes a few helpers through `torch.compiler.allow_in_graph` and `assume_constant_result`.
Each imports all of torch._dynamo and sympy: 0.9 s of CPU in every role process, six or more a run on a 2-core
machine. Both only mark a function for torch.compile, which the bus never uses, and return it unchanged, so the
import runs with both as the identity; they are put back after. Import this module before tensordict or
TransferQueue (relax.bus.batch and relax.bus.bus do); importing it later changes nothing.
"""

from __future__ import annotations

import sys

import torch.compiler


def _identity(fn):
    return fn


if "tensordict" not in sys.modules:
    _saved = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
    torch.compiler.allow_in_graph = torch.compiler.assume_constant_result = _identity
    try:
        import tensordict  # noqa: F401
    finally:
        torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = _saved
