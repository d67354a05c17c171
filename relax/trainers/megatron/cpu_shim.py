"""Run megatron-core on a CPU-only torch build: an EMULATION aid for tests, not a training backend.

megatron-core 0.16 has no CPU path: it creates tensors with `device="cuda"` / `torch.cuda.current_device()`,
calls `.cuda()` and keeps its RNG states with `torch.cuda.get_rng_state()` in dozens of places (causal mask, RoPE
frequencies, the pipeline schedule's token counter, DDP buffers, the optimizer's found-inf flag, grad clipping).
On a CPU build each of these raises "Torch not compiled with CUDA enabled". `enable()` lets the same, unmodified
megatron-core code run on the CPU so the Megatron trainer (GPTModel, DDP, optimizer, pipeline schedule,
vocab-parallel cross entropy) and the HF <-> Megatron conversion can be executed and checked on a machine with no
GPU:

- a torch function mode rewrites every CUDA device argument (`"cuda"`, `"cuda:N"`, an int, `torch.device("cuda")`)
  of factory functions and `Tensor.to` to `"cpu"`, makes `Tensor.cuda()` a no-op, and reports `Tensor.type()` with
  the CUDA name (grad clipping asserts `torch.cuda.FloatTensor`);
- `torch.cuda.Stream` / `Event` / `current_stream` / `stream` / `synchronize` are in-order no-ops (the MoE
  all-to-all dispatcher makes a side stream for its device-to-host copies);
- the MoE dispatcher's device-to-host copy of its split sizes returns numpy arrays, as it does from a GPU;
- `torch.cuda.current_device()` returns the CPU device (autograd runs backward functions outside the mode); torch.cuda's RNG calls and
  megatron's tracked CUDA RNG states use the CPU generator (dropout is 0 in our configs, so no random numbers are
  drawn under the tracker).

Nothing here is used when CUDA is available. It only makes sense for world size 1 or gloo process groups, with
Transformer Engine absent (the local spec) and fp32 parameters.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(d) -> bool:
    if d is None or isinstance(d, bool):
        return False
    if isinstance(d, int):
        return True  # an int device index means cuda:N
    if isinstance(d, str):
        return d.startswith("cuda")
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return False


class CudaAsCpu(TorchFunctionMode):
    """Every CUDA device argument becomes the CPU; `Tensor.cuda()` returns the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # megatron asserts 'torch.cuda.FloatTensor'
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _Event:
    def synchronize(self) -> None:  # CPU work is synchronous
        pass

    def wait(self, stream=None) -> None:
        pass

    def record(self, stream=None) -> None:
        pass


class _Stream:
    """One CPU 'stream' (everything runs in order): the MoE all-to-all dispatcher's side stream for device-to-host
    copies is the current stream, so it neither waits nor records."""

    def __new__(cls, *args, **kwargs):
        global _STREAM
        if _STREAM is None:
            _STREAM = super().__new__(cls)
        return _STREAM

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self) -> None:
        pass


_STREAM: _Stream | None = None
_MODE: CudaAsCpu | None = None


def enabled() -> bool:
    return _MODE is not None


def enable() -> None:
    """Install the CPU emulation for the rest of this process (idempotent). Refuses when CUDA is available."""
    global _MODE
    if _MODE is not None:
        return
    if torch.cuda.is_available():
        raise RuntimeError("cpu_shim is for CPU-only machines; CUDA is available here")
    from megatron.core.tensor_parallel import random as mrandom

    import contextlib

    torch.cuda.current_device = lambda: torch.device("cpu")  # also right where the mode is not active (backward)
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: _Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.manual_seed = lambda seed: None  # the CPU generator is seeded by torch.manual_seed
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # The MoE all-to-all dispatcher's split sizes must become numpy arrays "on the host"; megatron only converts
    # tensors that are on CUDA, so on the CPU they would stay tensors, which all_to_all_single refuses as splits.
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def _to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.detach().numpy()
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = _to_host
    if hasattr(token_dispatcher, "maybe_move_tensor_to_cpu"):
        token_dispatcher.maybe_move_tensor_to_cpu = _to_host
    _MODE = CudaAsCpu()
    _MODE.__enter__()


__all__ = ["CudaAsCpu", "enable", "enabled"]
