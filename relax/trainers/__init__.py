"""Trainers: the torch trainer, the Megatron-Core backend (relax/trainers/megatron/), the batching both use
(`batching`), the factory that picks one (`factory.build_trainer`) and the supervised warm-up loop
(`supervised`). This package's namespace holds the torch trainer and batching only: importing it never
imports a backend."""

from relax.trainers.batching import budget_slices, pack, pad_right
from relax.trainers.torch_trainer import TorchTrainer, compute_log_probs, token_log_probs

__all__ = ["TorchTrainer", "compute_log_probs", "budget_slices", "pack", "pad_right", "token_log_probs"]
