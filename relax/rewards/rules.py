"""String rules: exact match, multiple choice and format. Each raises on input it cannot grade."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from relax.rewards.extract import NUMBER_RE, answer_line, extract_answer, is_number, marked_answer

if TYPE_CHECKING:
    from relax.tasks.prompt import Prompt


def normalise(text: str) -> str:
    """Case, surrounding whitespace/`$`, a trailing period, inner runs of spaces and thousands commas
    are presentation, not content."""
    text = " ".join(text.strip().strip("$").strip().rstrip(".").split()).lower()
    return NUMBER_RE.sub(lambda m: m.group().replace(",", ""), text)


def _same(a: str, b: str) -> bool:
    a, b = normalise(a), normalise(b)
    try:  # "7.0" and "7" are the same number
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b


def exact(response_text: str, prompt: Prompt) -> float:
    found = extract_answer(response_text, prompt.answer)
    return float(found is not None and _same(found, prompt.answer))


# Letters are matched upper-case in free text ("the answer is a bit" is no choice); a marked answer or a
# response that is only a letter may be lower-case.
_LETTER_ONLY = re.compile(r"\s*\(?([A-Ea-e])\)?[.):]?\s*")
_LETTER_LEAD = re.compile(r"\s*\(?([A-Ea-e])\)?(?!\w)")
_LETTER_STATED = re.compile(r"(?i:answer|option|choice)(?:\s+is)?\s*[:=]?\s*\(?([A-E])\)?(?!\w)")
_LETTER_PAREN = re.compile(r"\(([A-E])\)")


def choice_letter(text: str) -> str | None:
    """The chosen letter: a boxed/tagged letter, 'answer is (B)', a lone '(B)', or a bare 'B' response.
    A standalone 'A' in prose is an article, so free text is never scanned for bare letters."""
    marked = marked_answer(text)
    if marked is not None and (m := _LETTER_LEAD.match(marked)):
        return m.group(1).upper()
    for pattern in (_LETTER_STATED, _LETTER_PAREN):
        found = pattern.findall(text)
        if found:
            return found[-1]
    m = _LETTER_ONLY.fullmatch(text)
    return m.group(1).upper() if m else None


def multiple_choice(response_text: str, prompt: Prompt) -> float:
    m = _LETTER_ONLY.fullmatch(prompt.answer)
    if m is None:
        raise ValueError(f"multiple_choice needs a letter A-E as the reference answer, got {prompt.answer!r}")
    return float(choice_letter(response_text) == m.group(1).upper())


def format_ok(response_text: str, prompt: Prompt) -> float:
    """1.0 when the response states its answer in a gradable form, right or wrong: marked (boxed, tagged,
    'Answer: ...') or, for a numeric reference, the whole response being one number (what warm-up teaches)."""
    if marked_answer(response_text) or answer_line(response_text):
        return 1.0
    return float(is_number(prompt.answer) and is_number(response_text))
