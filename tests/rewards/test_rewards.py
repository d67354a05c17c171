"""Reward rules on hand-written responses: right, wrong, malformed, and scorers that fail."""

import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import pytest

import relax.rewards as rewards
from relax.config import TaskConfig
from relax.rewards import RewardResult, get_reward, score_detailed
from relax.rewards.extract import boxed, extract_answer, last_number
from relax.tasks import Prompt, make_task


def P(answer: str, meta: dict | None = None) -> Prompt:
    return Prompt(prompt_id=3, question="q", prompt="q", answer=answer, meta=meta or {})


def score(name: str, text: str, prompt: Prompt) -> float:
    return get_reward(name)(text, prompt)


@pytest.mark.parametrize("text, number", [
    ("The answer is 7.", "7"), ("3 + 4 = 7", "7"), ("x = -5", "-5"), ("3-5", "5"), ("1,000 apples", "1000"),
    ("1,2,3", "3"), ("it is 2.5", "2.5"), ("no digits here", None), ("", None),
])
def test_last_number(text, number):
    assert last_number(text) == number


def test_boxed_takes_the_last_balanced_box():
    assert boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert boxed(r"\boxed{3") is None
    assert boxed("plain") is None


def test_extraction_prefers_marked_answers_then_last_number():
    assert extract_answer(r"maybe 3, so \boxed{4}. Check: 5", "4") == "4"
    assert extract_answer("<answer>12</answer> then 13", "12") == "12"
    assert extract_answer("5 + 9 = 14. Next, 2", "14") == "2"  # last number graded
    assert extract_answer("I think\nAnswer: Paris", "Paris") == "Paris"
    assert extract_answer(" 1 2\n3 4\n", "1 2\n3 4") == "1 2\n3 4"  # e.g. a grid, unmarked
    assert extract_answer("   ", "x") is None


def test_exact():
    for text in (" 7", "The answer is 7.", "7.0", r"\boxed{7}", "Answer: 7"):
        assert score("exact", text, P("7")) == 1.0, text
    assert score("exact", "1,000", P("1000")) == 1.0
    assert score("exact", "The answer is 8", P("7")) == 0.0
    assert score("exact", "17", P("7")) == 0.0
    assert score("exact", "", P("7")) == 0.0
    assert score("exact", "Answer:  New   York.", P("new york")) == 1.0
    assert score("exact", "Answer: Boston", P("new york")) == 0.0


def test_multiple_choice():
    for text in (r"\boxed{B}", "The answer is (B).", "Answer: B", "b", " (B) ", "<answer>B) 42</answer>"):
        assert score("multiple_choice", text, P("B")) == 1.0, text
    assert score("multiple_choice", "(A) looks tempting but (C) is right", P("C")) == 1.0
    # A bare "A" in prose is an article, not a choice.
    assert score("multiple_choice", "A cat sat on the mat", P("A")) == 0.0
    assert score("multiple_choice", "the answer is a bit unclear", P("A")) == 0.0
    assert score("multiple_choice", "The answer is (D).", P("B")) == 0.0
    result = score_detailed("multiple_choice", "B", P("42"))
    assert result.score == 0.0 and "letter" in result.error


def test_format_ignores_correctness():
    assert score("format", r"\boxed{8}", P("7")) == 1.0
    assert score("format", "work...\nAnswer: 8", P("7")) == 1.0
    assert score("format", " 8", P("7")) == 1.0  # a bare number, what warm-up teaches
    assert score("format", "It is 7", P("7")) == 0.0
    assert score("format", r"\boxed{}", P("7")) == 0.0
    assert score("format", "Paris", P("Paris")) == 0.0


def test_math_verify():
    half = P(r"\frac{1}{2}")
    for text in (r"so \boxed{\frac{1}{2}}", "Answer: 1/2", "it is 0.5"):
        assert score("math_verify", text, half) == 1.0, text
    assert score("math_verify", "Answer: 1/3", half) == 0.0
    assert score("math_verify", "", half) == 0.0
    assert score("math_verify", "42 is wrong, it is 43", P("42")) == 0.0


def test_math_verify_runs_off_the_main_thread():
    # math-verify's signal-based timeouts raise outside the main thread; the rule must turn them off there.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda t: score_detailed("math_verify", t, P("42")), ["Answer: 42", "41"]))
    assert results == [RewardResult(1.0), RewardResult(0.0)]


def test_math_verify_flags_an_unparsable_reference():
    result = score_detailed("math_verify", "Answer: 42", P(""))
    assert result == RewardResult(0.0, "math_verify: ValueError: cannot parse the reference answer ''")


def test_math_verify_survives_a_runaway_expression(monkeypatch):
    # A power tower that math-verify's own signal timeout cannot interrupt: the helper is killed instead.
    import relax.rewards.verify as verify

    monkeypatch.setattr(verify, "DEADLINE_S", 2.0)
    result = score_detailed("math_verify", r"\boxed{10^{10^{10^{10}}}}", P("42"))
    assert result.score == 0.0 and "took over 2s" in result.error
    assert score_detailed("math_verify", "Answer: 42", P("42")) == RewardResult(1.0)  # a fresh helper


def test_reasoning_gym_uses_the_datasets_own_scorer():
    cfg = TaskConfig(name="countdown", size=4, eval_size=0)
    p = make_task(cfg, seed=0, split="train")[0]
    assert score("reasoning_gym", f"<answer>{p.answer}</answer>", p) == 1.0
    # countdown evaluates the expression, so an equivalent one counts and a wrong one does not.
    assert score("reasoning_gym", f"<answer>({p.answer})</answer>", p) == 1.0
    assert score("reasoning_gym", "<answer>1 + 1</answer>", p) < 1.0
    # The scorer needs only the JSON-serialised prompt, as on another process.
    remote = Prompt(**json.loads(json.dumps(asdict(p))))
    assert score("reasoning_gym", f"<answer>{p.answer}</answer>", remote) == 1.0


def test_reasoning_gym_arithmetic_grades_the_last_number():
    cfg = TaskConfig(params={"min_terms": 2, "max_terms": 2, "max_digits": 2}, size=4, eval_size=0)
    p = make_task(cfg, seed=0, split="train")[0]
    assert score("reasoning_gym", f"Let me see. The result is {p.answer}.", p) == 1.0
    assert score("reasoning_gym", f"{p.answer}, or maybe 1000", p) == 0.0
    assert score("reasoning_gym", "", p) == 0.0


def test_reasoning_gym_on_a_foreign_prompt_is_flagged():
    result = score_detailed("reasoning_gym", "7", P("7"))
    assert result.score == 0.0 and "reasoning-gym" in result.error


def test_a_failing_rule_scores_zero_with_the_error(monkeypatch):
    def broken(text, prompt):
        raise RuntimeError("boom")

    monkeypatch.setitem(rewards.REWARDS, "exact", broken)
    assert score_detailed("exact", "7", P("7")) == RewardResult(0.0, "exact: RuntimeError: boom")
    assert score("exact", "7", P("7")) == 0.0

    monkeypatch.setitem(rewards.REWARDS, "exact", lambda text, prompt: float("nan"))
    result = score_detailed("exact", "7", P("7"))
    assert result.score == 0.0 and "non-finite" in result.error


def test_malformed_input_is_flagged_not_raised():
    for name in rewards.REWARDS:
        result = score_detailed(name, None, P("7"))
        assert result.score == 0.0 and "must be str" in result.error
    assert score_detailed("exact", "\x00\ufffd" * 1000, P("7")) == RewardResult(0.0)


def test_registry():
    with pytest.raises(ValueError, match="unknown reward 'nope'.*math_verify"):
        get_reward("nope")
    fn = pickle.loads(pickle.dumps(get_reward("exact")))  # roles receive it through Ray
    assert fn("7", P("7")) == 1.0
