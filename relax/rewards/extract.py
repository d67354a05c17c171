"""Answer extraction shared by the rules: pull the graded answer out of a free-form response."""

from __future__ import annotations

import re

# Thousands separators only in groups of three (so "1,2,3" stays a list); a minus sign only where it
# cannot be a binary minus ("3-5" ends in 5, "x=-5" in -5).
NUMBER_RE = re.compile(r"(?:(?<![\w)])-)?(?<![\d.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ANSWER_LINE = re.compile(r"answer(?:\s+is)?\s*[:=]\s*(.+)", re.I)


def boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent or unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` (reasoning-gym's convention)."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def answer_line(text: str) -> str | None:
    """The rest of the last 'Answer: ...' / 'answer is: ...' line (DAPO's convention)."""
    found = _ANSWER_LINE.findall(text)
    return found[-1].strip() if found else None


def last_number(text: str) -> str | None:
    found = NUMBER_RE.findall(text)
    return found[-1].replace(",", "") if found else None


def is_number(text: str) -> bool:
    return NUMBER_RE.fullmatch(text.strip()) is not None


def marked_answer(text: str) -> str | None:
    """An answer the response marks explicitly: boxed first, then an answer tag."""
    found = boxed(text)
    return found if found is not None else answer_tag(text)


def extract_answer(text: str, reference: str | None = None) -> str | None:
    """The answer to grade. Boxed or tagged content wins; otherwise a numeric reference grades the last
    number in the response ("last number graded"), any other an 'Answer:' line or else the whole response."""
    found = marked_answer(text)
    if found is not None:
        return found
    if reference is not None and is_number(reference):
        return last_number(text)
    found = answer_line(text)
    if found is not None:
        return found
    return text.strip() or None
