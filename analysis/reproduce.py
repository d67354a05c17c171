"""`make reproduce-fig`: run every CPU-scale experiment, then draw every figure and table."""

from __future__ import annotations

import argparse

from analysis.figures import draw_all
from analysis.results import ROOT, RESULTS
from relax.config import load_config
from relax.controller import run_experiment

EXPERIMENTS = ["experiments/colocate/cpu.yaml", "experiments/async/cpu-onpolicy.yaml", "experiments/async/cpu.yaml"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=None, help="override every experiment's step count")
    args = p.parse_args(argv)
    for i, path in enumerate(EXPERIMENTS, 1):
        cfg = load_config(ROOT / path, [f"steps={args.steps}"] if args.steps else [])
        print(f"[{i}/{len(EXPERIMENTS)}] {path}")
        run_dir, summary = run_experiment(cfg, out=RESULTS)
        print(f"    {run_dir}: {summary['mean_step_time_s']:.3f} s/step, reward "
              f"{summary['initial_reward']:.3f} -> {summary['final_reward']:.3f}")
    for fig in draw_all(RESULTS):
        print(fig)


if __name__ == "__main__":
    main()
