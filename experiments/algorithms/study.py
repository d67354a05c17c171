"""Algorithm comparison study: the same task, model, warm-up and RL settings, one policy loss / estimator changed.

`relax study algorithms [--config experiments/async/cpu.yaml] [--steps 30] [--only grpo gspo ...] [--out results]
[key=value ...]` runs `relax run CONFIG --steps N <overrides>` for each algorithm of variants.yaml, one after the
other (the warm-up is cached by config hash, so every run starts RL from the same weights), all with its `common`
overrides (a 16-prompt RL pool, the learning rate) and `--steps` (default: its `steps`), and writes
`<out>/algorithms/algorithms.json` (per algorithm: overrides, run folder, reward start/end, held-out eval,
host load) beside the runs under `<out>/algorithms/runs/`. analysis/algorithms.py draws it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from analysis.algorithms import RESULTS_FILE, draw_algorithms, reward_window
from experiments import launch
from relax.run_folder import RunFolder

VARIANTS = yaml.safe_load((Path(__file__).parent / "variants.yaml").read_text())
# name: (label, overrides of the base config)
ALGORITHMS: dict[str, tuple[str, list[str]]] = {
    name: (v["label"], list(v["overrides"])) for name, v in VARIANTS["algorithms"].items()}
COMMON: list[str] = list(VARIANTS["common"])
STEPS: int = VARIANTS["steps"]
CONFIG: str = VARIANTS["config"]


def run_study(config: str, steps: int, names: list[str], out: Path, extra: list[str] = ()) -> Path:
    root = out / "algorithms"
    root.mkdir(parents=True, exist_ok=True)
    path = root / RESULTS_FILE
    results = json.loads(path.read_text()) if path.exists() else {}
    results.setdefault("algorithms", {})
    results.update(config=config, steps=steps, common_overrides=[*COMMON, *extra])
    for name in names:
        label, overrides = ALGORITHMS[name]
        print(f"[algorithms] {name}: relax run {config} {' '.join(overrides)} --steps {steps}", flush=True)
        run_dir, summary = launch.run(config, [f"profile=cpu-{name}", *COMMON, *extra, *overrides, f"steps={steps}"],
                                      out=root / "runs")
        load = RunFolder(run_dir).host_load()
        rewards = [r["reward_mean"] for r in RunFolder(run_dir).metrics()]
        start, end = reward_window(rewards)
        results["algorithms"][name] = {
            "label": label, "overrides": overrides, "steps": len(rewards),
            "run": str(run_dir.relative_to(root)),
            "reward_start": round(start, 4), "reward_end": round(end, 4),
            **{k: summary[k] for k in ("eval_reward_start", "eval_reward_end", "eval_accuracy_start",
                                        "eval_accuracy_end", "mean_step_time_s", "train_time_s")},
            "load_before": load["loadavg_before"], "load_after": load["loadavg_after"], "wall_s": load["wall_s"],
        }
        print(f"    reward {start:.3f} -> {end:.3f}, held-out sampled reward {summary['eval_reward_start']:.3f} -> "
              f"{summary['eval_reward_end']:.3f} ({load['wall_s']:.0f} s)", flush=True)
        path.write_text(json.dumps(results, indent=2))
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps of each run (default {STEPS})")
    p.add_argument("--only", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides applied to every run (before its own)")


def main(args: argparse.Namespace) -> int:
    path = run_study(args.config, args.steps, args.only, args.out, args.overrides)
    for f in draw_algorithms(args.out, args.out / "figures", args.out / "tables"):
        print(f)
    print(path)
    return 0
