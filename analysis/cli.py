"""`relax report`, `relax figures`, `relax reproduce` and `relax recovery`: the analysis commands, registered
through the `relax.commands` entry points (pyproject.toml), so relax/cli.py never imports the harness.

The parsers are here; each command's module (which pulls in pandas and matplotlib, the `analysis` extra) is
imported only when its command runs, and its `main(args)` returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path


def run_module(module: str, args: argparse.Namespace) -> int:
    return importlib.import_module(module).main(args) or 0


def _parser(subparsers, name: str, module: str, help: str, doc: str = "") -> argparse.ArgumentParser:
    p = subparsers.add_parser(name, help=help, description=doc or help,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=lambda a: run_module(module, a))
    return p


def register_report(subparsers) -> None:
    p = _parser(subparsers, "report", "analysis.report", "a table of runs (steps/hour, step time, reward, accuracy, "
                "staleness), optionally against the paper's published numbers")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, or folders holding run folders")
    p.add_argument("--against", choices=["published"], help="add the published numbers and speed-ups")
    p.add_argument("--format", choices=["markdown", "csv"], default="markdown")


def register_figures(subparsers) -> None:
    p = _parser(subparsers, "figures", "analysis.figures", "every figure and table from run results (PNGs to "
                "DEST/figures/, Markdown + CSV tables to DEST/tables/)")
    p.add_argument("--source", type=Path, default=None,
                   help="results root to read (default: results/, or results/reference/ when it has no runs)")
    p.add_argument("--dest", type=Path, default=None, help="where figures/ and tables/ go (default: results/)")


def register_reproduce(subparsers) -> None:
    p = _parser(subparsers, "reproduce", "analysis.reproduce", "run every CPU-scale experiment and study, then draw "
                "every figure and table (make reproduce-fig)")
    p.add_argument("--steps", type=int, default=None, help="override every experiment's step count")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these (analysis/reproduce.py EXPERIMENTS, "
                   "STUDIES)")
    p.add_argument("--out", type=Path, default=None, help="results root (default: results/)")
    p.add_argument("--update-reference", action="store_true",
                   help="copy these runs to results/reference/ (the committed set `make figures` draws from)")
    p.add_argument("--no-figures", action="store_true")


def register_recovery(subparsers) -> None:
    p = _parser(subparsers, "recovery", "analysis.recovery", "the per-fault recovery table and figure of runs "
                "with injected faults (recovery_table.md, recovery.png)")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, help="folder for recovery_table.md / recovery.png (default: the run)")
