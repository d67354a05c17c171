"""Rule-based rewards, one registry.

`get_reward(name)` returns `fn(response_text, prompt) -> float`; `score_detailed(name, response_text,
prompt)` returns a `RewardResult` that also carries the error, if any. A rule that raises, or returns a
non-finite score, scores 0.0 with the error flagged: one bad row never crashes a run.

Rules: reasoning_gym (the dataset's own score_answer), math_verify (symbolic equivalence), exact
(normalised match), multiple_choice (letter A-E), format (answer stated in a gradable form), tool_answer
(an agent's first <answer>..</answer>, exact; relax/agent/env.py), genrm (`exact` outside the GenRM role).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable

from relax.agent.env import tool_answer
from relax.rewards.extract import extract_answer
from relax.rewards.gym import reasoning_gym
from relax.rewards.rules import exact, format_ok, multiple_choice
from relax.rewards.verify import math_verify

if TYPE_CHECKING:
    from relax.tasks.prompt import Prompt

__all__ = ["REWARDS", "RewardResult", "extract_answer", "get_reward", "score_detailed"]

log = logging.getLogger(__name__)

# The one table of rules: every reward name resolves here, nowhere else adds to it.
REWARDS: dict[str, Callable[[str, "Prompt"], float]] = {
    "reasoning_gym": reasoning_gym,
    "math_verify": math_verify,
    "exact": exact,
    "multiple_choice": multiple_choice,
    "format": format_ok,
    "tool_answer": tool_answer,
    # Outside the GenRM role (relax/roles/genrm.py serves the judge), a genrm task is graded by the ground
    # truth the judge approximates (relax/rewards/genrm.py).
    "genrm": exact,
}


@dataclass(frozen=True)
class RewardResult:
    score: float
    error: str | None = None


def _rule(name: str) -> Callable[[str, "Prompt"], float]:
    try:
        return REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(REWARDS)}") from None


def score_detailed(name: str, response_text: str, prompt: Prompt) -> RewardResult:
    rule = _rule(name)
    try:
        if not isinstance(response_text, str):
            raise TypeError(f"response_text must be str, got {type(response_text).__name__}")
        score = float(rule(response_text, prompt))
        if not math.isfinite(score):
            raise ValueError(f"non-finite score {score}")
        return RewardResult(score)
    except Exception as err:
        error = f"{name}: {type(err).__name__}: {err}"
        log.warning("reward failed for prompt %s: %s", getattr(prompt, "prompt_id", "?"), error)
        return RewardResult(0.0, error)


def _score(name: str, response_text: str, prompt: Prompt) -> float:
    return score_detailed(name, response_text, prompt).score


def get_reward(name: str) -> Callable[[str, Prompt], float]:
    """The named rule as `fn(response_text, prompt) -> float` (picklable, for Ray); unknown names fail
    here rather than on every row."""
    _rule(name)
    return partial(_score, name)
