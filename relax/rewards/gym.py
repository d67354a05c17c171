"""The reasoning-gym rule: the generating dataset's own `score_answer` on the extracted answer."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from relax.rewards.extract import extract_answer

if TYPE_CHECKING:
    from relax.tasks.prompt import Prompt


@lru_cache(maxsize=16)
def _dataset(name: str, params_json: str, seed: int, size: int) -> Any:
    import reasoning_gym as rg

    return rg.create_dataset(name, size=size, seed=seed, **json.loads(params_json))


@lru_cache(maxsize=8192)  # a group's samples share one entry, and some generators take ~50 ms per entry
def _entry(name: str, params_json: str, seed: int, size: int, index: int) -> dict:
    return _dataset(name, params_json, seed, size)[index]


def reasoning_gym(response_text: str, prompt: Prompt) -> float:
    meta = prompt.meta
    if meta.get("source") != "reasoning_gym":
        raise ValueError("the reasoning_gym reward needs a prompt made by a reasoning-gym task")
    # Regenerate the entry rather than grade against meta["entry"]: some scorers compare Python types
    # (ARC boards are tuples) that a JSON round trip turns into lists.
    key = (meta["dataset"], json.dumps(meta["params"], sort_keys=True), meta["seed"], meta["size"])
    entry = _entry(*key, meta["index"])
    return float(_dataset(*key).score_answer(extract_answer(response_text, prompt.answer), entry))
