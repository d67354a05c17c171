"""The environment interface of agentic rollouts, and a tool-using question-answering environment.

An `Environment` holds the state of ONE trajectory (a session): `reset(row)` gives the first observation
(the prompt and any media), `step(action_text)` takes the model's turn and returns the next observation, a
reward and whether the episode is over. Media an observation shows (an image a tool returned) are kept in
the session (`Session.media`), so later turns still see the images of earlier turns.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from relax.agent.tools import TOOL_END, ToolBox, parse_tool_call

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)


@dataclass
class MediaRef:
    """A medium shown to the model: referenced by URI; `features` are the processor's output (may be None
    until a processor fills them). `turn` is the turn that first showed it."""

    kind: str  # "image" | "audio" | "video"
    uri: str
    turn: int
    features: torch.Tensor | None = None


@dataclass
class Observation:
    text: str
    media: list[MediaRef] = field(default_factory=list)


@dataclass
class StepResult:
    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Session:
    """Per-trajectory state an environment keeps between turns."""

    row: dict[str, Any]
    turn: int = 0
    media: list[MediaRef] = field(default_factory=list)  # every medium shown so far, in order
    tool_calls: int = 0
    tool_errors: int = 0
    memory: dict[str, Any] = field(default_factory=dict)  # free-form environment state


class Environment(ABC):
    session: Session

    @abstractmethod
    def reset(self, row: dict[str, Any]) -> Observation: ...

    @abstractmethod
    def step(self, action: str) -> StepResult: ...


def default_grader(answer: str, expected: str) -> float:
    return float(answer.strip() == str(expected).strip())


def tool_answer(response_text: str, prompt) -> float:
    """The reward rule of agent tasks (`task.reward: tool_answer`) on the model's own text (its turns joined,
    observations left out). The rollout cuts every turn just after its first `</tool>`, so splitting there
    gives back the turns; like ToolEnv, a turn holding a well-formed tool call goes on, the first other turn
    ends the episode and is graded on its `<answer>..</answer>` (none: 0)."""
    turns = response_text.split(TOOL_END)
    for i, turn in enumerate(turns):
        if i < len(turns) - 1 and parse_tool_call(turn + TOOL_END) is not None:
            continue
        m = ANSWER_RE.search(turn)
        return default_grader(m.group(1), prompt.answer) if m is not None else 0.0
    return 0.0


class ToolEnv(Environment):
    """Question answering with tools. Each model turn either calls a tool (`<tool>calc: 3*4</tool>`; the
    reply comes back as `<obs>...</obs>`), or answers (`<answer>12</answer>`, graded by rule, ends the
    episode). A turn with neither ends the episode with reward 0. `media_tools` return a MediaRef (e.g. an
    image) that joins the session's media."""

    def __init__(self, tools: ToolBox | None = None, grader: Callable[[str, str], float] = default_grader,
                 media_tools: dict[str, Callable[[str, Session], MediaRef]] | None = None):
        self.tools = tools or ToolBox()
        self.grader = grader
        self.media_tools = media_tools or {}

    def reset(self, row):
        if "question" not in row or "answer" not in row:
            raise ValueError("ToolEnv.reset: a row needs 'question' and 'answer'")
        self.session = Session(row=dict(row))
        media = [MediaRef(m.kind, m.uri, 0, m.features) for m in row.get("media", [])]
        self.session.media.extend(media)
        return Observation(row["question"], media)

    def step(self, action):
        s = self.session
        s.turn += 1
        call = parse_tool_call(action)
        if call is not None:
            s.tool_calls += 1
            if call.name in self.media_tools:
                try:
                    ref = self.media_tools[call.name](call.argument, s)
                    ref.turn = s.turn
                    s.media.append(ref)
                    return StepResult(Observation(f"<obs>{ref.kind} {ref.uri}</obs>", [ref]), 0.0, False,
                                      {"tool": call.name, "ok": True})
                except Exception as err:  # noqa: BLE001 - a failing tool is an observation, not a crash
                    s.tool_errors += 1
                    return StepResult(Observation(f"<obs>error: {type(err).__name__}</obs>"), 0.0, False,
                                      {"tool": call.name, "ok": False})
            text, ok = self.tools.call(call.name, call.argument)
            s.tool_errors += not ok
            return StepResult(Observation(f"<obs>{text}</obs>"), 0.0, False, {"tool": call.name, "ok": ok})
        m = ANSWER_RE.search(action)
        if m is not None:
            return StepResult(Observation(""), self.grader(m.group(1), s.row["answer"]), True, {"answered": True})
        return StepResult(Observation(""), 0.0, True, {"answered": False})
