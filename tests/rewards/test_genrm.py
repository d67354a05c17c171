"""GenRM: template, score parsing, and a judge that fails or times out marks the row instead of crashing."""

import time

import pytest
import torch

from relax.config import ModelConfig
from relax.models import build_model
from relax.rewards import REWARDS
from relax.rewards.genrm import ERR_FAILED, ERR_OK, ERR_TIMEOUT, GenRMJudge, fill, parse_score

TEMPLATE = "Q: {question} A: {response} Ref: {answer} Score:"


class FakeTok:
    pad_token_id = eos_token_id = 0

    def encode(self, text):
        return [1 + (ord(c) % 50) for c in text]

    def decode(self, ids):
        return self.reply


class FakeLM:
    """A judge whose generate() answers `reply` after `delay` seconds (or raises)."""

    def __init__(self, reply="1", delay=0.0, fail=False):
        self.reply, self.delay, self.fail = reply, delay, fail

    def eval(self):
        return self

    def generate(self, input_ids, max_time=None, **kw):
        if self.fail:
            raise RuntimeError("judge exploded")
        time.sleep(self.delay)
        return torch.cat([input_ids, torch.ones(1, 2, dtype=torch.long)], 1)


def _judge(**kw):
    lm = FakeLM(**kw)
    tok = FakeTok()
    tok.reply = lm.reply
    return GenRMJudge(lm, tok, TEMPLATE)


ROWS = [("1+1", "2", "2"), ("2+2", "5", "4"), ("3+3", "6", "6")]


def test_fill_and_parse():
    assert fill(TEMPLATE, "1+1", "2", "2") == "Q: 1+1 A: 2 Ref: 2 Score:"
    assert parse_score(" 1") == 1.0 and parse_score("score: 0.5 of 1") == 0.5 and parse_score("7") == 1.0
    with pytest.raises(ValueError):
        parse_score("yes")


def test_judge_scores_rows():
    out = _judge(reply=" 1 because").score(ROWS, timeout_s=5)
    assert [(j.score, j.error) for j in out] == [(1.0, ERR_OK)] * 3


def test_failure_marks_the_sample():
    out = _judge(fail=True).score(ROWS, timeout_s=5)
    assert all(j.score == 0.0 and j.error == ERR_FAILED and "exploded" in j.message for j in out)
    out = _judge(reply="no idea").score(ROWS, timeout_s=5)  # unparsable reply
    assert all(j.error == ERR_FAILED and "no score" in j.message for j in out)


def test_timeout_marks_the_rest_of_the_batch():
    out = _judge(reply="1", delay=0.3).score(ROWS, timeout_s=0.45)
    assert out[0].error == ERR_OK and out[0].score == 1.0
    assert [j.error for j in out[1:]] == [ERR_TIMEOUT, ERR_TIMEOUT]
    assert all(j.score == 0.0 for j in out[1:])


def test_real_tiny_judge_with_max_time():
    """A real (random-init) causal LM: generation is bounded by max_time, and every row gets a result."""
    model, tok = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                         intermediate_size=64), seed=0)
    judge = GenRMJudge(model, tok, TEMPLATE, max_new_tokens=3)
    out = judge.score(ROWS, timeout_s=30)
    assert len(out) == 3 and all(j.error in (ERR_OK, ERR_FAILED) for j in out)
    assert all(0.0 <= j.score <= 1.0 for j in out)
    t0 = time.monotonic()
    out = judge.score(ROWS * 50, timeout_s=0.05)
    assert time.monotonic() - t0 < 5 and out[-1].error == ERR_TIMEOUT


def test_genrm_task_outside_the_role_uses_the_exact_rule():
    assert REWARDS["genrm"] is REWARDS["exact"]
