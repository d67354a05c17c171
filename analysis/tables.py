"""The one table writer: `results/tables/<name>.{csv,md}` side by side, for the figures and every study.

A table is a pandas DataFrame (the run tables of analysis/figures.py: pandas renders its CSV and pipe table) or
a list of row dicts with their columns (the studies' metric tables, whose cells mix text and numbers: each cell
written as it is, None as empty).
"""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(table, path: Path, columns: list[str] | None = None) -> Path:
    """`table` as CSV at `path` (row dicts: only `columns`, in that order)."""
    if columns is None:
        table.to_csv(path, index=False)
    else:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(table)
    return path


def markdown(table, columns: list[str] | None = None) -> str:
    """`table` as a Markdown pipe table (no trailing newline)."""
    if columns is None:
        return table.to_markdown(index=False)
    cell = lambda v: "" if v is None else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in table]
    return "\n".join(lines)


def write_table(table, out: Path, name: str, title: str, note: str = "",
                columns: list[str] | None = None) -> list[Path]:
    """`<out>/<name>.csv` and `<out>/<name>.md` (titled table, then `note`). `columns`: `table` is a list of
    row dicts with these keys; without it, a DataFrame."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(table, out / f"{name}.csv", columns)
    text = f"# {title}\n\n{markdown(table, columns)}\n"
    if note:
        text += f"\n{note}\n"
    (out / f"{name}.md").write_text(text)
    return [out / f"{name}.csv", out / f"{name}.md"]
