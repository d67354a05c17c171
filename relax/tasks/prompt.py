"""A task's prompt: the plain record tasks hand out and rewards grade. A leaf: it imports nothing of relax,
so relax.rewards can name it without importing the tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    prompt_id: int
    question: str
    prompt: str  # the question wrapped in task.prompt_template: what the model sees
    answer: str
    # JSON-serialisable; enough for the reward to grade the row on another process (`Prompt(**asdict(p))`).
    meta: dict[str, Any] = field(default_factory=dict)
