"""The paper's published numbers: the one reader of results/published/relax_paper.csv.

Every published value a table, figure, study result or README quotes comes from here, so the CSV is the only
place one is written down. Rows: experiment, system, mode, model, hardware, metric, value, unit, source.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published" / "relax_paper.csv"
PAPER = "arXiv 2604.11554"


@lru_cache(maxsize=None)
def rows(path: Path = PUBLISHED) -> tuple[dict, ...]:
    """Every row of the CSV, `value` as a float."""
    with open(path, newline="") as f:
        return tuple({**r, "value": float(r["value"])} for r in csv.DictReader(f))


def value(experiment: str, system: str, mode: str, metric: str) -> float | None:
    """The published `metric` of (experiment, system, mode), None when the paper has none."""
    return next((r["value"] for r in rows() if (r["experiment"], r["system"], r["mode"], r["metric"])
                 == (experiment, system, mode, metric)), None)

