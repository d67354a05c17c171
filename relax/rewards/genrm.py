"""GenRM: a generative judge. A causal LM reads a prompt template filled with the question, the response
(and the reference answer) and replies; the first number of its reply is the score, clipped to [0, 1].

`GenRMJudge.score(rows, timeout_s)` grades a batch under one deadline (greedy generation, stopped by
transformers' `max_time`; rows not reached in time are not started). A row whose judge call raises, whose
reply holds no number, or that runs out of time scores 0.0 and carries an error code in `reward_error`
(ERR_OK / ERR_FAILED / ERR_TIMEOUT) and a message: one bad row never crashes the run.

The GenRM role (relax/roles/genrm.py) serves the judge as its own service when `task.reward: genrm`.
Outside that role (held-out greedy accuracy, warm-up), a genrm task is graded by the `exact` rule, the
ground truth the judge approximates (the table in relax/rewards/__init__.py maps "genrm" to it).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

ERR_OK, ERR_FAILED, ERR_TIMEOUT = 0, 1, 2
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def parse_score(reply: str) -> float:
    """First number in the judge's reply, clipped to [0, 1]; raises ValueError when there is none."""
    m = _NUMBER.search(reply)
    if m is None:
        raise ValueError(f"no score in judge reply {reply[:60]!r}")
    return min(1.0, max(0.0, float(m.group())))


def fill(template: str, question: str, response: str, answer: str = "") -> str:
    return template.replace("{question}", question).replace("{response}", response).replace("{answer}", answer)


@dataclass
class Judged:
    score: float
    error: int = ERR_OK
    message: str = ""


class GenRMJudge:
    """A causal LM judge (`model` a transformers causal LM, `tokenizer` relax's encode/decode interface)."""

    def __init__(self, model, tokenizer, template: str, max_new_tokens: int = 4):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.template = template
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def reply(self, prompt: str, max_time: float) -> str:
        ids = torch.tensor([self.tokenizer.encode(prompt)], dtype=torch.long)
        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=self.max_new_tokens, max_time=max_time,
                                  pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
        return self.tokenizer.decode(out[0, ids.shape[1]:].tolist())

    def score(self, rows: list[tuple[str, str, str]], timeout_s: float) -> list[Judged]:
        """rows: (question, response, reference answer). One deadline for the whole batch."""
        deadline = time.monotonic() + timeout_s
        out = []
        for question, response, answer in rows:
            left = deadline - time.monotonic()
            if left <= 0:
                out.append(Judged(0.0, ERR_TIMEOUT, f"genrm: timed out after {timeout_s}s"))
                continue
            try:
                text = self.reply(fill(self.template, question, response, answer), left)
                if time.monotonic() > deadline:  # generation was cut by max_time: the reply is partial
                    out.append(Judged(0.0, ERR_TIMEOUT, f"genrm: timed out after {timeout_s}s"))
                    continue
                out.append(Judged(parse_score(text)))
            except Exception as err:  # a judge failure marks the row, never the run
                out.append(Judged(0.0, ERR_FAILED, f"genrm: {type(err).__name__}: {err}"))
        return out
