"""What every task hands the rest of the engine: indexed prompts and a scorer."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from relax.rewards import RewardResult, get_reward, score_detailed
from relax.tasks.prompt import Prompt


# A loader's row: question, answer, meta.
Row = tuple[str, str, dict[str, Any]]


class Task:
    """A fixed-length, indexable split of a task; rows are made on demand by `row(i)`."""

    def __init__(self, name: str, template: str, reward: str, length: int, row: Callable[[int], Row]):
        self.name = name
        self.reward = reward
        self._template = template
        self._length = length
        # Roles look rows up again per sample, and some generators take ~50 ms per row.
        self._row = lru_cache(maxsize=8192)(row)
        self._score = get_reward(reward)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> Prompt:
        if not -self._length <= i < self._length:
            raise IndexError(f"prompt {i} out of range for a task of {self._length}")
        i %= self._length
        question, answer, meta = self._row(i)
        # replace, not str.format: a template may carry literal braces such as "\boxed{}".
        prompt = self._template.replace("{question}", question)
        return Prompt(prompt_id=i, question=question, prompt=prompt, answer=answer, meta=meta)

    def score(self, prompt: Prompt, response_text: str) -> float:
        return self._score(response_text, prompt)

    def score_detailed(self, prompt: Prompt, response_text: str) -> RewardResult:
        return score_detailed(self.reward, response_text, prompt)


def supervised_pairs(task: Task, n: int) -> list[tuple[str, str]]:
    """(prompt, target) pairs for supervised warm-up, cycling through the task. The target is the answer
    as the model should emit it right after the prompt (the tokenizer appends EOS)."""
    if len(task) == 0:
        raise ValueError(f"task {task.name!r} has no prompts to warm up on")
    pairs = []
    for i in range(n):
        p = task[i % len(task)]
        sep = "" if not p.prompt or p.prompt[-1].isspace() else " "
        pairs.append((p.prompt, sep + p.answer))
    return pairs
