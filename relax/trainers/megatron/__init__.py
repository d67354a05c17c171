"""Megatron-LM training backend: HF <-> Megatron weight conversion (pure tensor work, importable on CPU) and the
Megatron-Core trainer (`relax.trainers.megatron.trainer`, needs megatron-core; real training needs CUDA, while on a
CPU-only machine `cpu_shim` emulates megatron-core's CUDA calls so tests can run the same code)."""

from relax.trainers.megatron.convert import (
    Parallel,
    QwenLayout,
    copy_hf_into_model,
    hf_state_from_model,
    hf_to_megatron,
    hf_to_megatron_shards,
    iter_megatron_to_hf,
    megatron_shards_to_hf,
    megatron_to_hf,
    merge,
    model_state_from_hf,
    padded_vocab_size,
    shard,
)

__all__ = ["Parallel", "QwenLayout", "copy_hf_into_model", "hf_state_from_model", "hf_to_megatron", "hf_to_megatron_shards",
           "iter_megatron_to_hf", "megatron_shards_to_hf", "megatron_to_hf", "merge", "model_state_from_hf",
           "padded_vocab_size", "shard"]
