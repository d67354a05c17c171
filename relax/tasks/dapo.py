"""dapo_math: math problems with reference answers from a local parquet or jsonl file (cluster profile).

`task.params.path` names the file. Rows follow DAPO-Math-17k: `prompt` (a string or chat messages) and
`reward_model.ground_truth`; `problem`/`question` and `answer`/`solution` columns also work. Repeated
problems are kept once; the rest are shuffled by the seed, eval takes the first `task.eval_size`, train
the next `task.size`.
"""

from __future__ import annotations

import json
from pathlib import Path
from random import Random
from typing import Any, Callable

from relax.config import TaskConfig
from relax.tasks.base import Row


def _plain(x: Any) -> Any:
    """Parquet cells as JSON types (numpy arrays and scalars, where a reader returns them, become lists and
    Python scalars)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return _plain(x.tolist()) if hasattr(x, "tolist") else x


def _read(path: Path) -> list[dict]:
    if not path.is_file():
        raise ValueError(f"task.params.path: no such file {str(path)!r}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ValueError(f"task.params.path: reading parquet needs pyarrow (pip install pyarrow): {err}") from err
        return [_plain(r) for r in pq.read_table(path).to_pylist()]
    if path.suffix in (".jsonl", ".json"):
        rows = []
        for n, raw in enumerate(path.read_bytes().splitlines(), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"task.params.path: {path.name} line {n} is not UTF-8 text "
                                 f"(byte 0x{raw[err.start]:02x} at column {err.start + 1})") from None
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"task.params.path: {path.name} line {n} is not JSON: {err}") from err
        return rows
    raise ValueError(f"task.params.path: expected a .parquet or .jsonl file, got {path.name!r}")


def _question(row: dict) -> str | None:
    prompt = row.get("prompt")
    if isinstance(prompt, list):  # chat messages: the last user turn holds the problem
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else None
    return next((q for q in (prompt, row.get("problem"), row.get("question")) if isinstance(q, str)), None)


def _answer(row: dict) -> str | None:
    model = row.get("reward_model")
    truth = model.get("ground_truth") if isinstance(model, dict) else None
    found = next((a for a in (truth, row.get("answer"), row.get("solution")) if a is not None), None)
    return None if found is None else str(found)


def load(cfg: TaskConfig, seed: int, split: str) -> tuple[int, Callable[[int], Row]]:
    unknown = set(cfg.params) - {"path"}
    if "path" not in cfg.params or unknown:
        raise ValueError(f"task.params: dapo_math takes exactly {{path: <parquet or jsonl file>}}, got {cfg.params}")
    path = Path(cfg.params["path"]).expanduser()
    records = _read(path)
    by_question: dict[str, Row] = {}
    for r, record in enumerate(records):  # every row, so a bad file fails the same way for both splits
        question, answer = (_question(record), _answer(record)) if isinstance(record, dict) else (None, None)
        if question is None or answer is None:
            missing = "question (prompt/problem/question)" if question is None else "answer (reward_model.ground_truth/answer/solution)"
            raise ValueError(f"task.params.path: {path.name} row {r} has no {missing}")
        # The released DAPO-Math-17k repeats each problem many times; one copy each keeps the splits disjoint.
        by_question.setdefault(question, (question, answer, {"source": "dapo_math", "row": r}))
    rows = list(by_question.values())
    if cfg.eval_size >= len(rows):
        raise ValueError(f"task.eval_size: {cfg.eval_size} leaves no training rows in {path.name} ({len(rows)} distinct problems)")
    order = list(range(len(rows)))
    Random(seed).shuffle(order)
    picked = order[: cfg.eval_size] if split == "eval" else order[cfg.eval_size : cfg.eval_size + cfg.size]
    return len(picked), lambda i: rows[picked[i]]
