"""A multi-turn trajectory kept as ONE sample: the prompt, then model turns interleaved with tool /
environment observations, with a loss mask that is 1 exactly on the model's own tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relax.agent.env import MediaRef


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)  # 0.0 on masked (tool / environment) tokens
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, start, end) in response_ids
    media: list[MediaRef] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    truncated: bool = False  # turn cap or token budget hit before the episode ended
    weight_versions: list[int] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_model(self, ids: list[int], log_probs: list[float]) -> None:
        if len(ids) != len(log_probs):
            raise ValueError("add_model: one log-prob per token")
        self.spans.append(("model", len(self.response_ids), len(self.response_ids) + len(ids)))
        self.response_ids += list(ids)
        self.loss_mask += [1] * len(ids)
        self.log_probs += [float(x) for x in log_probs]

    def add_observation(self, ids: list[int]) -> None:
        self.spans.append(("obs", len(self.response_ids), len(self.response_ids) + len(ids)))
        self.response_ids += list(ids)
        self.loss_mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)


def trajectory_rows(trajs: list[Trajectory]) -> dict:
    """The bus fields of a list of trajectories (one row each)."""
    return {
        "prompt_ids": [torch.tensor(t.prompt_ids, dtype=torch.long) for t in trajs],
        "response_ids": [torch.tensor(t.response_ids, dtype=torch.long) for t in trajs],
        "loss_mask": [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs],
        "rollout_log_probs": [torch.tensor(t.log_probs, dtype=torch.float32) for t in trajs],
        "env_reward": torch.tensor([t.reward for t in trajs], dtype=torch.float32),  # the environment's grade
        "num_turns": torch.tensor([t.turns for t in trajs]),
        "truncated": torch.tensor([int(t.truncated) for t in trajs]),
        "weight_version": torch.tensor([min(t.weight_versions, default=0) for t in trajs]),
        "total_len": torch.tensor([len(t.prompt_ids) + len(t.response_ids) for t in trajs]),
    }
