"""Head-room benchmark: does RL raise held-out accuracy from a warm start that leaves room to learn?

`relax study headroom [--config experiments/headroom/cpu.yaml] [--seeds 0 1 2] [--steps N] [--set default|full |
--only grpo ...] [--parallel] [--out results] [key=value ...]` runs `relax run CONFIG seed=S <variant overrides>` for
every seed of every variant of variants.yaml (`--set`: a named list of variants there, default `default`), one after
the other (each seed has its own warm-up, cached by config hash, and its own
disjoint train / eval prompts), and writes `<out>/headroom/headroom.json`: per run the greedy held-out accuracy
at the warm-up start and after RL (summary.json's eval_accuracy_*, on task.eval_size prompts RL never trained
on), the training seconds and the host load. analysis/headroom.py turns it into the table of mean gain with its
95% interval, the reward against wall time and the tokens/s: the algorithm table.

A user's algorithm is one more row: register it (relax/algorithms/, README "add your own algorithm"), then
`relax study headroom --row NAME algorithm.policy_loss=my_loss ...`: its key=value overrides become the variant
NAME (not applied to the built-ins), run for every seed, and its rows join the others in headroom.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from analysis.headroom import RESULTS_FILE, write_headroom
from experiments import launch
from relax.run_folder import RunFolder

VARIANTS = yaml.safe_load((Path(__file__).parent / "variants.yaml").read_text())
# name: (label, overrides of the base config)
RUNS: dict[str, tuple[str, list[str]]] = {n: (v["label"], list(v["overrides"])) for n, v in VARIANTS["variants"].items()}
CONFIG: str = VARIANTS["config"]
SEEDS: list[int] = list(VARIANTS["seeds"])
SETS: dict[str, list[str]] = {k: list(v) for k, v in VARIANTS["sets"].items()}
unknown = {n for names in SETS.values() for n in names} - set(RUNS)
assert not unknown, f"variants.yaml: sets name variants it does not define: {sorted(unknown)}"


def _record(results: dict, root: Path, name: str, seed: int, run_dir: Path, summary: dict, extra: list[str],
            parallel: bool = False) -> None:
    label, overrides = RUNS[name]
    folder = RunFolder(run_dir)
    load = folder.host_load() or {}
    results["runs"][f"{name}/seed{seed}"] = {
        "variant": name, "label": label, "seed": seed, "overrides": overrides, "common_overrides": list(extra),
        "run": str(Path(run_dir).relative_to(root)), "steps": len(folder.metrics()),
        "eval_size": folder.config()["task"]["eval_size"],
        **{k: summary[k] for k in ("eval_accuracy_start", "eval_accuracy_end", "eval_reward_start",
                                    "eval_reward_end", "train_time_s", "mean_step_time_s", "tokens_per_s")},
        "eval_curve": summary.get("eval_curve", []),  # task.eval_every: held-out accuracy against step / wall time
        "load_before": load.get("loadavg_before"), "load_after": load.get("loadavg_after"), "wall_s": load.get("wall_s"),
        "parallel": parallel,  # the variant's seeds ran at the same time, sharing the cores
    }
    print(f"    {name} seed {seed}: greedy held-out {summary['eval_accuracy_start']:.3f} -> "
          f"{summary['eval_accuracy_end']:.3f} ({summary['train_time_s']:.0f} s of training, "
          f"load {(load.get('loadavg_before') or ['?'])[0]})", flush=True)


def run_study(config: str, seeds: list[int], names: list[str], out: Path, steps: int | None = None,
              extra: list[str] = (), parallel: bool = False) -> Path:
    root = out / "headroom"
    root.mkdir(parents=True, exist_ok=True)
    path = root / RESULTS_FILE
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("runs", {})
    results.update(config=config, common_overrides=list(extra))
    for name in names:
        args = lambda seed: [f"profile=cpu-{name}", *extra, *RUNS[name][1], f"seed={seed}",  # noqa: E731
                             *([f"steps={steps}"] if steps else [])]
        for seed in seeds:
            print(f"[headroom] {name} seed {seed}: relax run {config} {' '.join(args(seed))}", flush=True)
        if parallel:  # every seed at once: they share the cores (each run's host load says how much)
            spawned = {s: launch.spawn(config, args(s), out=root / "runs", run=f"seed{s}",
                                       log=root / f"{name}-seed{s}.log") for s in seeds}
            failed = []
            for seed, child in spawned.items():  # wait for every seed: one failing leaves the others running
                if child.wait() != 0:
                    failed.append(f"{name} seed {seed} (see {root / f'{name}-seed{seed}.log'})")
                    continue
                _record(results, root, name, seed, child.run_dir, RunFolder(child.run_dir).summary(), extra, True)
                path.write_text(json.dumps(results, indent=2))
            if failed:
                raise RuntimeError(f"failed: {', '.join(failed)}; the others are recorded in {path}")
        else:
            for seed in seeds:
                run_dir, summary = launch.run(config, args(seed), out=root / "runs", run=f"seed{seed}")
                _record(results, root, name, seed, run_dir, summary, extra)
                path.write_text(json.dumps(results, indent=2))
        path.write_text(json.dumps(results, indent=2))
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--seeds", type=int, nargs="+", default=SEEDS, help=f"seeds of each variant (default {SEEDS})")
    p.add_argument("--steps", type=int, default=None, help="steps of each run (default: the config's)")
    p.add_argument("--set", choices=list(SETS), default="default", help="a named list of variants (variants.yaml)")
    p.add_argument("--only", nargs="+", choices=list(RUNS), default=None, help="these variants (instead of --set)")
    p.add_argument("--row", metavar="NAME", default=None,
                   help="run the key=value overrides as one new variant NAME (a user's algorithm) beside the built-ins")
    p.add_argument("--parallel", action="store_true", help="run a variant's seeds at the same time (sharing the cores)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run (before its own)")


def main(args: argparse.Namespace) -> int:
    extra = list(args.overrides)
    if args.row is not None:
        if args.row in RUNS:
            raise SystemExit(f"--row {args.row}: a built-in variant has that name; pick another")
        if not extra:
            raise SystemExit("--row NAME needs the key=value overrides that make the algorithm")
        RUNS[args.row] = (f"user: {' '.join(extra)}", extra)
        names, extra = [args.row], []
    else:
        names = args.only or SETS[args.set]
    path = run_study(args.config, args.seeds, names, args.out, args.steps, extra, args.parallel)
    for f in write_headroom(args.out, args.out / "tables"):
        print(f)
    print(path)
    return 0
