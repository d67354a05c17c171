"""Reading run folders (DESIGN.md section 7) into pandas tables for figures and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PUBLISHED = RESULTS / "published" / "relax_paper.csv"
SKIP = {"published", "figures", "tables", "reference"}


def run_dirs(root: Path) -> list[Path]:
    """Every complete run (has summary.json) under root, skipping non-run folders."""
    return sorted(p.parent for p in root.glob("*/*/*/summary.json") if p.parts[len(root.parts)] not in SKIP)


def latest_runs(root: Path) -> dict[tuple[str, str], Path]:
    """The newest run of each (experiment, profile)."""
    out: dict[tuple[str, str], Path] = {}
    for d in run_dirs(root):
        key = (d.parent.parent.name, d.parent.name)
        if key not in out or d.name > out[key].name:
            out[key] = d
    return out


def load_summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def load_metrics(run: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    df = pd.json_normalize(rows)
    df.columns = [c.replace("busy_s.", "busy_s/") for c in df.columns]
    return df


def published() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED)


def published_value(experiment: str, system: str, mode: str, metric: str) -> float | None:
    df = published()
    hit = df[(df.experiment == experiment) & (df.system == system) & (df["mode"] == mode) & (df.metric == metric)]
    return float(hit.value.iloc[0]) if len(hit) else None
