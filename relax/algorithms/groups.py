"""Per-prompt group statistics (GRPO groups: responses sharing a `group_index`) and DAPO dynamic sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupStats:
    """Statistics of each element's group, gathered back to the elements: every field is [B]."""

    mean: Tensor
    std: Tensor  # unbiased (n-1), as torch.std and the GRPO reference; 0 for a group of one
    size: Tensor
    degenerate: Tensor  # bool: every reward in the group is equal (including groups of one), no signal


def group_stats(values: Tensor, group_index: Tensor) -> GroupStats:
    if values.shape != group_index.shape or values.dim() != 1:
        raise ValueError(f"values {tuple(values.shape)} and group_index {tuple(group_index.shape)} must both be [B]")
    _, inv = torch.unique(group_index, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    size = torch.bincount(inv, minlength=n_groups).to(values.dtype)
    mean = values.new_zeros(n_groups).index_add_(0, inv, values) / size
    sq_dev = (values - mean[inv]).square()
    var = values.new_zeros(n_groups).index_add_(0, inv, sq_dev) / (size - 1).clamp(min=1)
    hi = values.new_full((n_groups,), -torch.inf).scatter_reduce(0, inv, values, "amax")
    lo = values.new_full((n_groups,), torch.inf).scatter_reduce(0, inv, values, "amin")
    return GroupStats(mean=mean[inv], std=var.sqrt()[inv], size=size[inv], degenerate=(hi == lo)[inv])


def filter_groups(rewards: Tensor, group_index: Tensor) -> Tensor:
    """DAPO dynamic sampling: bool keep-mask [B] that drops every group whose rewards are all equal
    (all-correct or all-wrong groups have zero group-relative advantage, hence no gradient)."""
    return ~group_stats(rewards.float(), group_index).degenerate
