"""Researchers' own data (relax/tasks/data_files.py): jsonl, parquet and save_to_disk folders read through
`datasets`, the column mapping, chat messages, and a bad row named by file, row and column."""

import json

import pytest

from relax.config import TaskConfig
from relax.tasks import make_task

datasets = pytest.importorskip("datasets")


def _rows(n):
    # Plain columns, a nested answer and chat messages, as a researcher's file may hold them.
    return [{"q": f"What is {i} squared?", "sol": {"value": str(i * i)},
             "chat": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Square {i}."}]}
            for i in range(n)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path, rows):
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _folder(path, rows):
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


WRITERS = {"jsonl": _jsonl, "parquet": _parquet, "folder": _folder}


def _task(path, part="train", name="local_dataset", **params):
    cfg = TaskConfig(name=name, params={"path": str(path), **params}, size=100, eval_size=2, reward="exact",
                     prompt_template="Q: {question}\nA:")
    return make_task(cfg, 0, part)


@pytest.mark.parametrize("fmt", WRITERS)
def test_each_format_reads_every_row_through_the_mapping(tmp_path, fmt):
    rows = _rows(8)
    path = WRITERS[fmt](tmp_path / f"data.{fmt}", rows + rows[:3])  # repeated questions are kept once
    train, ev = _task(path, prompt="q", answer="sol.value"), _task(path, "eval", prompt="q", answer="sol.value")
    assert (len(train), len(ev)) == (6, 2)
    got = {p.question: p for p in list(train) + list(ev)}
    assert set(got) == {r["q"] for r in rows}
    p = got["What is 3 squared?"]
    assert p.answer == "9" and p.prompt == "Q: What is 3 squared?\nA:"
    assert p.meta["file"] == path.name and p.meta["row"] == 3
    assert train.score(p, " 9") == 1.0 and train.score(p, " 6") == 0.0


@pytest.mark.parametrize("fmt", WRITERS)
def test_chat_messages_give_the_last_user_turn(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"data.{fmt}", _rows(5))
    both = [*_task(path, messages="chat", answer="sol.value"), *_task(path, "eval", messages="chat", answer="sol.value")]
    assert sorted(p.question for p in both) == [f"Square {i}." for i in range(5)]
    assert all(p.answer == str(int(p.question[7]) ** 2) for p in both)


def test_dapo_math_defaults_to_dapo_columns(tmp_path):
    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i} squared?"}],
             "reward_model": {"ground_truth": str(i * i), "style": "rule"}} for i in range(6)]
    path = _parquet(tmp_path / "dapo.parquet", rows)
    task = _task(path, name="dapo_math")
    assert len(task) == 4 and all(p.question.startswith("What is") for p in task)
    assert {p.answer for p in task} <= {str(i * i) for i in range(6)}


def test_a_folder_holding_splits_needs_one_named(tmp_path):
    path = tmp_path / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(5)),
                          "test": datasets.Dataset.from_list(_rows(4))}).save_to_disk(str(path))
    assert len(_task(path, prompt="q", answer="sol.value", split="test")) == 2
    with pytest.raises(ValueError, match=r"task.params.split: dd holds splits \['test', 'train'\]"):
        _task(path, prompt="q", answer="sol.value")


@pytest.mark.parametrize("fmt", WRITERS)
def test_a_bad_row_is_named_by_file_row_and_column(tmp_path, fmt):
    rows = _rows(6)
    rows[4] = {**rows[4], "sol": {"value": None}}
    path = WRITERS[fmt](tmp_path / f"data.{fmt}", rows)
    with pytest.raises(ValueError, match=rf"task.params.answer: data.{fmt} row 4 column 'sol.value': .*None"):
        _task(path, prompt="q", answer="sol.value")
    rows = _rows(6)
    rows[2] = {**rows[2], "q": "  ", "chat": [{"role": "system", "content": "no user"}]}
    path = WRITERS[fmt](tmp_path / f"two.{fmt}", rows)
    with pytest.raises(ValueError, match=rf"task.params.prompt: two.{fmt} row 2 column 'q': expected non-empty text"):
        _task(path, prompt="q", answer="sol.value")
    with pytest.raises(ValueError, match=rf"task.params.messages: two.{fmt} row 2 column 'chat': no user turn"):
        _task(path, messages="chat", answer="sol.value")


def test_a_bad_mapping_or_file_is_named(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", _rows(4))
    with pytest.raises(ValueError, match="task.params.answer: no column 'solution' in data.jsonl \\(columns: q, sol, chat\\)"):
        _task(path, prompt="q", answer="solution")
    with pytest.raises(ValueError, match="task.params.answer: data.jsonl row 0 has no 'sol.text'"):
        _task(path, prompt="q", answer="sol.text")
    with pytest.raises(ValueError, match="task.params: give exactly one of prompt"):
        _task(path, answer="sol.value")
    with pytest.raises(ValueError, match="task.params.colums: Extra inputs"):
        _task(path, prompt="q", colums="x")
    with pytest.raises(ValueError, match="task.params.path: no such file or folder"):
        _task(tmp_path / "missing.jsonl", prompt="q")
    with pytest.raises(ValueError, match="task.params.path: expected a .jsonl, .json or .parquet"):
        _task(_jsonl(tmp_path / "rows.csv", []), prompt="q")
    with pytest.raises(ValueError, match="task.params.path: .* is not a folder written by save_to_disk"):
        _task(tmp_path, prompt="q")
    with pytest.raises(ValueError, match="task.eval_size"):
        _task(_jsonl(tmp_path / "two.jsonl", _rows(2)), prompt="q", answer="sol.value")
    with pytest.raises(ValueError, match="task.reward"):
        make_task(TaskConfig(name="local_dataset", params={"path": str(path), "prompt": "q"}), 0, "train")


def test_an_unreadable_jsonl_line_is_named(tmp_path):
    good = json.dumps({"q": "1+1?", "a": "2"}).encode() + b"\n"
    for content, where in [(good + b'{"q": "caf\xe9", "a": "1"}\n', "data.jsonl line 2 is not UTF-8 text"),
                           (good + good + b"{not json\n", "data.jsonl line 3 is not JSON"),
                           (good + b"[1, 2]\n", "data.jsonl line 2 is a JSON list")]:
        (tmp_path / "data.jsonl").write_bytes(content)
        with pytest.raises(ValueError, match=f"task.params.path: {where}"):
            _task(tmp_path / "data.jsonl", prompt="q", answer="a")
