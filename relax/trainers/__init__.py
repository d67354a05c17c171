"""Trainers: the torch trainer, the Megatron-Core backend (relax/trainers/megatron/), the batching both use
(`batching`; its torch-free cutting and padding rule in `budget`), the factory that picks one
(`factory.build_trainer`) and the supervised warm-up loop (`supervised`). This package's namespace holds the torch
trainer and batching only, resolved lazily: importing it never imports a backend, nor torch (relax.sim reads
`budget`)."""

from relax.lazy import lazy_getattr

_HOME = {"TorchTrainer": "torch_trainer", "compute_log_probs": "torch_trainer", "token_log_probs": "torch_trainer",
         "budget_slices": "budget", "pack": "batching", "pad_right": "batching"}
__all__ = list(_HOME)

__getattr__ = lazy_getattr(__name__, _HOME)
