"""Per-prompt group statistics (GRPO groups: responses sharing a `group_index`) and DAPO dynamic sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

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


@dataclass
class SampledGroup:
    """One group slot's final draw: its prompt, the G outputs, their rewards, and how many draws it took."""

    prompt: int
    outputs: list
    rewards: list[float]
    attempts: int

    @property
    def informative(self) -> bool:
        return max(self.rewards) != min(self.rewards)


def sample_informative_groups(slots: Sequence[int], prompt_for: Callable[[int, int], int],
                              generate: Callable[[list[int]], list], score: Callable[[int, object], float],
                              group_size: int, max_batches: int) -> dict[int, SampledGroup]:
    """DAPO dynamic sampling with a cap: draw a group for every slot, then redraw (a fresh prompt,
    `prompt_for(slot, attempt)`) only the slots whose rewards are all equal, in one batched `generate` per
    round, until every slot is informative or `max_batches` rounds have run. A slot still degenerate at the
    cap keeps its last draw (the Advantages role then marks it and the Actor skips it).

    `generate(prompts)` returns one output per prompt (each prompt repeated `group_size` times);
    `score(prompt, output)` is the task reward. Returns {slot: SampledGroup}."""
    if max_batches < 1:
        raise ValueError(f"max_batches must be >= 1, got {max_batches}")
    out: dict[int, SampledGroup] = {}
    pending = list(slots)
    for attempt in range(max_batches):
        if not pending:
            break
        prompts = [prompt_for(s, attempt) for s in pending]
        gens = generate([p for p in prompts for _ in range(group_size)])
        for n, (s, p) in enumerate(zip(pending, prompts)):
            outs = gens[n * group_size : (n + 1) * group_size]
            out[s] = SampledGroup(p, outs, [float(score(p, o)) for o in outs], attempt + 1)
        pending = [s for s in pending if not out[s].informative]
    return out
