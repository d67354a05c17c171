"""Where a `relax bench NAME` writes its JSON: `--out`, else results/<NAME>_bench/<time>.json (one rule for all)."""

from __future__ import annotations

import json
import time
from pathlib import Path


def write_bench(result: dict, name: str, out: str | None) -> Path:
    path = Path(out or f"results/{name}_bench/{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    return path
