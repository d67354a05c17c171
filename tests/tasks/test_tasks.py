"""Tasks: seeded splits, prompt fields, scoring, warm-up pairs (data files: test_data_files.py)."""

import json
from dataclasses import asdict

import pytest

from relax.config import TaskConfig
from relax.tasks import Prompt, make_task, supervised_pairs
from relax.tasks.gym import SPAN, base_seed

ADD = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"]}


def test_basic_arithmetic_prompts():
    cfg = TaskConfig(params=ADD, size=50, eval_size=8, prompt_template="Q: {question}\nA:")
    train, ev = make_task(cfg, 0, "train"), make_task(cfg, 0, "eval")
    assert (len(train), len(ev)) == (50, 8)
    p = train[7]
    assert p.prompt_id == 7 and p.prompt == f"Q: {p.question}\nA:"
    assert "+" in p.question and int(p.answer) == eval(p.question.removeprefix("Calculate ").rstrip("."))
    assert json.loads(json.dumps(p.meta)) == p.meta
    assert train[-1] == train[49]
    with pytest.raises(IndexError):
        train[50]
    assert [p.prompt_id for p in ev] == list(range(8))


def test_splits_are_seeded_and_disjoint():
    cfg = TaskConfig(size=500, eval_size=64)  # default params: up to 6 terms of 4 digits, no chance repeats
    questions = lambda seed, split: [p.question for p in make_task(cfg, seed, split)]
    train = questions(0, "train")
    assert questions(0, "train") == train
    assert not set(train) & set(questions(0, "eval"))
    assert not set(train) & set(questions(1, "train"))
    # Each (seed, split) owns a disjoint range of reasoning-gym item seeds.
    starts = sorted(base_seed(s, split) for s in range(4) for split in ("train", "eval"))
    assert all(b - a >= SPAN for a, b in zip(starts, starts[1:]))


def test_score_and_json_round_trip():
    task = make_task(TaskConfig(params=ADD, size=4), 0, "train")
    p = task[0]
    assert task.score(p, f"{p.question[10:-1]} = {p.answer}") == 1.0
    assert task.score(p, "I don't know") == 0.0
    remote = Prompt(**json.loads(json.dumps(asdict(p))))  # as it crosses the bus
    assert task.score(remote, p.answer) == 1.0
    assert task.score_detailed(p, None).error is not None


@pytest.mark.parametrize("name, reward", [("gsm_symbolic", "reasoning_gym"), ("countdown", "reasoning_gym"),
                                          ("chain_sum", "math_verify"), ("gsm_symbolic", "exact")])
def test_other_datasets_by_name(name, reward):
    task = make_task(TaskConfig(name=name, size=3, eval_size=2, reward=reward), 0, "eval")
    assert len(task) == 2
    for p in task:
        assert p.question and p.answer
        assert task.score(p, f"<answer>{p.answer}</answer>") == 1.0


def test_bad_name_and_params_name_the_field():
    with pytest.raises(ValueError, match="task.name.*'no_such_task'"):
        make_task(TaskConfig(name="no_such_task"), 0, "train")
    with pytest.raises(ValueError, match="task.params.*max_digitz"):
        make_task(TaskConfig(params={"max_digitz": 2}), 0, "train")
    with pytest.raises(ValueError, match="task.params.*max_digits must be >= min_digits"):
        make_task(TaskConfig(params={"min_digits": 3, "max_digits": 1}), 0, "train")
    with pytest.raises(ValueError, match="split"):
        make_task(TaskConfig(), 0, "test")


def test_template_may_hold_literal_braces():
    cfg = TaskConfig(params=ADD, size=2, prompt_template=r"{question} Put it in \boxed{}.")
    p = make_task(cfg, 0, "train")[0]
    assert p.prompt == p.question + r" Put it in \boxed{}."


def test_empty_eval_split():
    assert len(make_task(TaskConfig(eval_size=0), 0, "eval")) == 0


def test_supervised_pairs():
    task = make_task(TaskConfig(params=ADD, size=3), 0, "train")
    pairs = supervised_pairs(task, 7)
    assert len(pairs) == 7 and pairs[3] == pairs[0]  # cycles through the task
    prompt, target = pairs[1]
    assert prompt == task[1].prompt and target == " " + task[1].answer
    chat = make_task(TaskConfig(params=ADD, size=3, prompt_template="{question}\nassistant\n"), 0, "train")
    assert supervised_pairs(chat, 1)[0][1] == chat[0].answer  # no space after a newline
    with pytest.raises(ValueError, match="no prompts"):
        supervised_pairs(make_task(TaskConfig(eval_size=0), 0, "eval"), 1)


def test_exclude_eval_questions_drops_them_from_training():
    cfg = TaskConfig(params=ADD, size=300, eval_size=20, exclude_eval_questions=True)
    train, ev = make_task(cfg, 0, "train"), make_task(cfg, 0, "eval")
    held_out = {p.question for p in ev}
    assert len(ev) == 20 and 0 < len(train) < 300
    assert not held_out & {p.question for p in train}
    assert [p.prompt_id for p in train] == list(range(len(train)))
