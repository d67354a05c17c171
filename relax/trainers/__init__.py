from relax.trainers.torch_trainer import (
    TorchTrainer,
    build_trainer,
    budget_slices,
    compute_log_probs,
    pack,
    pad_right,
    token_log_probs,
)

__all__ = ["TorchTrainer", "build_trainer", "compute_log_probs", "budget_slices", "pack", "pad_right", "token_log_probs"]
