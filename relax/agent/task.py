"""Agent tasks for the engine (relax.tasks, `task.kind: agent`): questions a tool makes easy.

`tool_arith`: "a*b=" for a, b drawn from [lo, hi) (two-digit by default), answer a*b, graded on the
model's `<answer>..</answer>` (reward `tool_answer`). A tiny model cannot multiply two-digit numbers in its
head; it can learn to call `<tool>calc: a*b</tool>` and copy the observation into its answer.
"""

from __future__ import annotations

import random

PARAMS = {"lo", "hi"}


def load(cfg, seed: int, split: str):
    unknown = set(cfg.params) - PARAMS
    if unknown:
        raise ValueError(f"task.params: tool_arith takes {sorted(PARAMS)}, not {sorted(unknown)}")
    lo, hi = int(cfg.params.get("lo", 10)), int(cfg.params.get("hi", 100))
    if not 0 <= lo < hi:
        raise ValueError(f"task.params: tool_arith needs 0 <= lo < hi, got lo={lo} hi={hi}")
    size = cfg.size if split == "train" else max(cfg.eval_size, 1)

    def row(i: int):
        rng = random.Random(f"tool_arith-{seed}-{split}-{i}")
        a, b = rng.randrange(lo, hi), rng.randrange(lo, hi)
        return f"{a}*{b}=", str(a * b), {"a": a, "b": b}

    return size, row


def demo_turns(a: int, b: int, answer: str) -> list[tuple[str, str]]:
    """The intended episode as (kind, text) turns: a calculator call, its observation, the answer."""
    return [("model", f"<tool>calc: {a}*{b}</tool>"), ("obs", f"<obs>{answer}</obs>"),
            ("model", f"<answer>{answer}</answer>")]
