"""Tasks from researchers' own data: a local `.jsonl`/`.json` file, a `.parquet` file, or a folder written by
`datasets`' `save_to_disk`, read through the `datasets` library, offline (the hub is never asked).

`task.name: local_dataset` maps the columns with `task.params` (`DataParams`: path, prompt or messages, answer,
split). `dapo_math` is the same reader with DAPO-Math-17k's columns as the defaults (chat messages in `prompt`,
the answer in `reward_model.ground_truth`). Every row is checked when a split is built, and preflight builds
both splits before Ray starts, so a bad row fails `relax validate` and `relax run` naming the file, the row
(0-based) and the column. Repeated questions are kept once (DAPO-Math-17k repeats each problem; one copy keeps
the splits disjoint); the rest are shuffled by the seed, eval takes the first `task.eval_size`, train the next
`task.size`.
"""

from __future__ import annotations

import json
from pathlib import Path
from random import Random
from typing import Any, Callable

from pydantic import ValidationError, model_validator

from relax.config import Strict, TaskConfig
from relax.tasks.base import Row


class DataParams(Strict):
    """task.params of a data-file task: where the rows are and which columns hold what."""

    path: str  # a .jsonl / .json file, a .parquet file, or a save_to_disk folder
    prompt: str | None = None  # column holding the question as text
    # Column holding chat messages ([{role, content}, ...]): the question is the last user turn's content
    # (task.prompt_template renders one user turn; earlier turns are not sent to the model).
    messages: str | None = None
    answer: str = "answer"  # column holding the reference answer; dots reach into structs (reward_model.ground_truth)
    split: str | None = None  # for a folder holding a DatasetDict: which split to read

    @model_validator(mode="after")
    def _one_question_column(self) -> "DataParams":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt (a text column) or messages (a chat-messages column)")
        return self


# Defaults per task name; the user's task.params override them.
DEFAULTS = {"local_dataset": {}, "dapo_math": {"messages": "prompt", "answer": "reward_model.ground_truth"}}


def params(cfg: TaskConfig) -> DataParams:
    try:
        return DataParams.model_validate({**DEFAULTS[cfg.name], **cfg.params})
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        raise ValueError(f"task.params{'.' + where if where else ''}: {msg} ({cfg.name} takes "
                         f"{', '.join(DataParams.model_fields)})") from None


def _first_bad_line(path: Path) -> str | None:
    """Where a JSON-lines file stops being JSON lines (read only after the library failed, to name the line)."""
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"line {n} is not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            return f"line {n} is not JSON: {err}"
        if not isinstance(record, dict):
            return f"line {n} is a JSON {type(record).__name__}, not an object of columns"
    return None


def read(p: DataParams):
    """The rows as a `datasets.Dataset`; every way the file can be unreadable is a ValueError naming it."""
    import datasets

    datasets.config.HF_DATASETS_OFFLINE = datasets.config.HF_HUB_OFFLINE = True  # local files only, always
    datasets.disable_progress_bars()  # a bar per load would flood every role's log
    path = Path(p.path).expanduser()
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError, OSError) as err:
            raise ValueError(f"task.params.path: {str(path)!r} is not a folder written by save_to_disk: {err}") from None
        if isinstance(ds, datasets.DatasetDict):
            if p.split not in ds:
                raise ValueError(f"task.params.split: {path.name} holds splits {sorted(ds)}; name one "
                                 f"(got {p.split!r})")
            ds = ds[p.split]
        elif p.split is not None:
            raise ValueError(f"task.params.split: {path.name} is a single dataset with no splits; drop split")
        return ds
    if not path.is_file():
        raise ValueError(f"task.params.path: no such file or folder {str(path)!r}")
    builder = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}.get(path.suffix)
    if builder is None:
        raise ValueError(f"task.params.path: expected a .jsonl, .json or .parquet file or a save_to_disk folder, "
                         f"got {path.name!r}")
    if p.split is not None:
        raise ValueError(f"task.params.split: {path.name} is one file with no splits; drop split")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as err:  # the library wraps parse errors (DatasetGenerationError, ArrowInvalid, ...)
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: Exception) -> ValueError:
    where = _first_bad_line(path) if path.suffix == ".jsonl" else None
    cause = err.__cause__ or err
    return ValueError(f"task.params.path: {path.name} {where or f'cannot be read: {type(cause).__name__}: {cause}'}")


def _cell(record: dict, column: str) -> Any:
    value: Any = record
    for key in column.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(column)
        value = value[key]
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected non-empty text, got {value!r}"[:200])
    return value


def _last_user_turn(messages: Any) -> str:
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"expected chat messages (a list of {{role, content}}), got {messages!r}"[:200])
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    if not users:
        raise ValueError(f"no user turn among roles {[m.get('role') for m in messages]}")
    return _text(users[-1])


def _answer(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a text or number answer, got {value!r}"[:200])
    if isinstance(value, str) and not value.strip():
        raise ValueError("the answer is empty")
    return str(value)


def _checked(record: dict, name: str, r: int, key: str, column: str, parse: Callable[[Any], str]) -> str:
    """One cell, parsed; a failure names the file, the row, the column and the task.params key mapping it."""
    try:
        return parse(_cell(record, column))
    except KeyError:
        raise ValueError(f"task.params.{key}: {name} row {r} has no {column!r}") from None
    except ValueError as err:
        raise ValueError(f"task.params.{key}: {name} row {r} column {column!r}: {err}") from None


def load(cfg: TaskConfig, seed: int, split: str) -> tuple[int, Callable[[int], Row]]:
    p = params(cfg)
    ds = read(p)
    name = Path(p.path).name
    fields = {"prompt": p.prompt, "messages": p.messages, "answer": p.answer}
    used = {k: c for k, c in fields.items() if c is not None}
    for key, column in used.items():
        if column.split(".")[0] not in ds.column_names:
            raise ValueError(f"task.params.{key}: no column {column.split('.')[0]!r} in {name} "
                             f"(columns: {', '.join(ds.column_names)})")
    try:
        records = ds.select_columns(sorted({c.split(".")[0] for c in used.values()})).to_list()
    except UnicodeDecodeError as err:  # pyarrow's JSON reader keeps bad bytes; decoding them to str fails here
        raise _unreadable(Path(p.path).expanduser(), err) from None
    by_question: dict[str, Row] = {}
    for r, record in enumerate(records):  # every row, so a bad file fails the same way for both splits
        if p.messages:
            question = _checked(record, name, r, "messages", p.messages, _last_user_turn)
        else:
            question = _checked(record, name, r, "prompt", p.prompt, _text)
        answer = _checked(record, name, r, "answer", p.answer, _answer)
        by_question.setdefault(question, (question, answer, {"source": cfg.name, "file": name, "row": r}))
    rows = list(by_question.values())
    if cfg.eval_size >= len(rows):
        raise ValueError(f"task.eval_size: {cfg.eval_size} leaves no training rows in {name} "
                         f"({len(rows)} distinct questions)")
    order = list(range(len(rows)))
    Random(seed).shuffle(order)
    picked = order[: cfg.eval_size] if split == "eval" else order[cfg.eval_size : cfg.eval_size + cfg.size]
    return len(picked), lambda i: rows[picked[i]]
