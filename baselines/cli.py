"""`relax baseline verl|openrlhf CONFIG [overrides] [--mode M] --dry-run [--out DIR]`.

Translates a Relax experiment into veRL's or OpenRLHF's own launch, prints it as one shell-quoted line and
writes launch.sh plus the files it names into --out (default results/baselines/<framework>/<experiment>/<mode>/).
The command names those files by absolute path, so put --out on a filesystem every node sees, then run
launch.sh inside the framework's own image; it tees the console to train.log for `parse_log`. Without
--dry-run the command refuses: those frameworks never run in Relax's environment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from baselines import openrlhf, verl
from baselines.common import default_out
from relax.config import load_config

FRAMEWORKS = {"verl": verl, "openrlhf": openrlhf}
# The release whose parser / configs the translation was checked against.
VERSIONS = {"verl": "0.9.1", "openrlhf": "0.11.2"}
# The mode a framework runs when --mode is not given, by the config's own mode.
DEFAULT_MODE = {"verl": {"colocate": "colocate", "async": "fully_async"},
                "openrlhf": {"colocate": "colocate", "async": "async"}}


def register(subparsers) -> argparse.ArgumentParser:
    """Add `baseline` to the `relax` sub-commands."""
    p = subparsers.add_parser("baseline", help="write veRL's or OpenRLHF's own launch of an experiment (dry run)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("framework", choices=sorted(FRAMEWORKS))
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.path=/models/Qwen3-4B")
    p.add_argument("--mode", help="verl: " + ", ".join(verl.MODES) + "; openrlhf: " + ", ".join(openrlhf.MODES)
                   + " (default: the config's mode, async meaning verl fully_async)")
    p.add_argument("--dry-run", action="store_true", help="print the command and write its files (required)")
    p.add_argument("--out", help="folder for launch.sh and its files")
    p.set_defaults(func=cmd_baseline)
    return p


def cmd_baseline(args) -> int:
    fw = args.framework
    if not args.dry_run:
        print(f"relax baseline: not launching {fw}: it runs in its own environment or image, never in Relax's. "
              f"Re-run with --dry-run to write its launch, then run launch.sh where {fw} is installed.", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
        mode = args.mode or DEFAULT_MODE[fw][cfg.mode]
        out = Path(args.out).resolve() if args.out else default_out(fw, cfg, mode)
        plan = FRAMEWORKS[fw].translate(cfg, mode, out)
    except (ValueError, OSError) as err:  # bad config or path, or what the framework cannot express
        print(f"relax baseline: {err}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for name, text in plan.config_files.items():
        (out / name).write_text(text)
    header = (f"{fw} {VERSIONS[fw]} launch (mode {mode}) of {args.config}, written by `relax baseline`.\n"
              f"Run it where {fw} is installed; read train.log with baselines.{fw}.parse_log.")
    launch = out / "launch.sh"
    launch.write_text(plan.script(header))
    launch.chmod(0o755)
    print(plan.shell())
    print(f"relax baseline: wrote {', '.join(sorted([launch.name, *plan.config_files]))} to {out}", file=sys.stderr)
    return 0
