"""The committed reference set (results/reference/): the one copier, with one size cap for every file.

`make figures` redraws every figure and table from it, so it keeps each run's small files (no weights, no
checkpoints) and each study's own result files; a file over MAX_FILE_BYTES stays out (a long run's trace:
its figures lose only the Gantt panel).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from relax.run_folder import CONFIG, HOST_LOAD, METRICS, RECOVERY, SUMMARY, TRACE

RUN_FILES = [CONFIG, METRICS, SUMMARY, HOST_LOAD, RECOVERY, TRACE]
STUDY_SUFFIXES = {".json", ".jsonl", ".yaml", ".csv", ".md"}
MAX_FILE_BYTES = 400_000


def copy_small(src: Path, dest: Path) -> bool:
    """Copy the file `src` to `dest` (folders made) unless it is over MAX_FILE_BYTES; whether it was copied."""
    if not src.is_file() or src.stat().st_size > MAX_FILE_BYTES:
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
    return True


def copy_run(src: Path, dest: Path) -> None:
    """A run folder's small RUN_FILES into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        copy_small(src / name, dest / name)


def copy_study(src: Path, dest: Path) -> None:
    """A study folder's small result files (STUDY_SUFFIXES: results json, per-run metrics and summaries, README),
    at the same relative paths under `dest`."""
    for f in src.rglob("*"):
        if f.suffix in STUDY_SUFFIXES:
            copy_small(f, dest / f.relative_to(src))


def clear(reference: Path, keep: set[str] = frozenset()) -> None:
    """Empty `reference` (made when absent), but for the children named in `keep`."""
    reference.mkdir(parents=True, exist_ok=True)
    for child in reference.iterdir():
        if child.name not in keep:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
