"""The trainer factory: `training.trainer` picks a trainer role's backend, all behind one interface
(`log_probs`, `accumulate`, `divide_grads`, `step`, `sync_hf`, optimizer state).

  torch:    `TorchTrainer` (relax/trainers/torch_trainer.py) on the transformers model in this process;
  megatron: a Megatron-Core trainer (relax/trainers/megatron/trainer.py), one rank here or a worker group
            (relax/trainers/megatron/group.py).

The backends know nothing of each other; only this module knows them all.
"""

from __future__ import annotations

from relax.config import ExperimentConfig


def build_trainer(cfg: ExperimentConfig, model, pad_id: int, role: str = "actor"):
    """The trainer of `role` for `model` (a transformers causal LM) under `training.trainer`."""
    if cfg.training.trainer == "megatron":
        return build_megatron_trainer(cfg, model, pad_id, role)
    from relax.trainers.torch_trainer import TorchTrainer

    return TorchTrainer(model, pad_id, cfg)


def build_megatron_trainer(cfg: ExperimentConfig, model, pad_id: int, role: str = "actor"):
    """The Megatron trainer of one role from the experiment config, loaded with `model`'s (transformers) weights.
    World size 1 (`relax.config.role_world_size`): this process (one GPU, or the CPU under cpu_shim). More, or
    `resources.<role>.workers` set: a `MegatronGroup` (relax/trainers/megatron/group.py) with this process as rank 0
    and a Ray worker per other rank."""
    from relax.config import role_world_size
    from relax.trainers.megatron.convert import hf_state_from_model

    world = role_world_size(cfg, role)
    if world > 1 or getattr(cfg.resources, role).workers is not None:  # workers: 1 -> a group of one (GPU check)
        from relax.trainers.megatron.group import MegatronGroup

        return MegatronGroup(cfg, model, pad_id, world, role)
    from relax.trainers.megatron.trainer import build_rank_trainer

    return build_rank_trainer(cfg, model.config, hf_state_from_model(model), pad_id, role)


__all__ = ["build_megatron_trainer", "build_trainer"]
