"""Small result tables written as CSV + Markdown side by side (the studies' `results/tables/<name>.{csv,md}`)."""

from __future__ import annotations

import csv
from pathlib import Path


def write_rows(rows: list[dict], cols: list[str], tables_dir: Path, name: str, title: str, note: str) -> list[Path]:
    """`rows` (dicts keyed by `cols`) as `<name>.csv` and `<name>.md` (titled table, then `note`; None: empty)."""
    tables_dir = Path(tables_dir)
    tables_dir.mkdir(parents=True, exist_ok=True)
    with open(tables_dir / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    fmt = lambda v: "" if v is None else str(v)  # noqa: E731
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
    (tables_dir / f"{name}.md").write_text("\n".join(lines) + f"\n\n{note}\n")
    return [tables_dir / f"{name}.csv", tables_dir / f"{name}.md"]
