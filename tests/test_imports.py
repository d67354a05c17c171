"""relax/imports.py: tensordict imports without torch._dynamo, and leaves torch.compiler as it found it."""

import subprocess
import sys

CHECK = """
import sys, torch.compiler
before = {n: getattr(torch.compiler, n) for n in ("allow_in_graph", "assume_constant_result")}
import relax, tensordict, torch
assert "torch._dynamo" not in sys.modules, "tensordict pulled in torch._dynamo"
assert all(getattr(torch.compiler, n) is f for n, f in before.items()), "torch.compiler's markers not restored"
assert type(tensordict.__loader__).__name__ == "SourceFileLoader", tensordict.__loader__
td = tensordict.TensorDict({"x": torch.arange(3)}, batch_size=[3])
assert td[1]["x"].item() == 1
assert not any(type(f).__name__ == "_Finder" for f in sys.meta_path), "the finder stays after its one use"
print("ok")
"""


def test_tensordict_imports_without_dynamo_and_restores_torch_compiler():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_without_the_finder_tensordict_does_import_dynamo():
    """The check above can fail: a plain import (the finder not installed) loads torch._dynamo."""
    code = "import sys, tensordict; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]
