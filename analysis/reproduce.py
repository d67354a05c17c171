"""`make reproduce-fig` (`relax reproduce`): run every CPU-scale experiment, then draw every figure and table.

Runs, in order (each a `relax run` of the file with the overrides shown, experiments/launch.py):
  relax colocate, async on-policy (max_staleness 0), async off-policy (max_staleness 1),
  veRL and OpenRLHF schedules EMULATED, and the staleness sweep's s = 2 and 4 (s = 0 and 1 are the
  on-policy and off-policy runs). Each run folder also gets host_load.json: the machine's load average
  before and after it, so numbers taken while something else used the cores can be told apart.

Then the studies (STUDIES: R3 overhead and mismatch, ...), each a `relax study NAME` writing under results/<name>/.

`relax reproduce [--steps N] [--only NAME ...] [--update-reference]`
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from analysis.figures import draw_all
from analysis.results import REFERENCE, RESULTS, ROOT

# (name, experiment file, overrides)
EXPERIMENTS = [
    ("colocate", "experiments/colocate/cpu.yaml", []),
    ("async-on-policy", "experiments/async/cpu-onpolicy.yaml", []),
    ("async-off-policy", "experiments/async/cpu.yaml", []),
    ("verl-emulated", "experiments/async/cpu-verl.yaml", []),
    ("openrlhf-emulated", "experiments/async/cpu-openrlhf.yaml", []),
    ("staleness-2", "experiments/async/cpu.yaml", ["profile=cpu-staleness2", "max_staleness=2"]),
    ("staleness-4", "experiments/async/cpu.yaml", ["profile=cpu-staleness4", "max_staleness=4"]),
]
# Studies that are not one `relax run` (several runs, side-by-side measurements): (name, `relax` argv). Each is
# run as `relax ARGV --out OUT` in its own process and writes under OUT/<name>/; its drawer is in
# analysis.figures.STUDIES.
STUDIES: list[tuple[str, list[str]]] = [
    ("r3_moe", ["study", "r3_moe"]),
    # GRPO's held-out accuracy gain on the head-room benchmark, seed 0 (2m40s quiet with its warm-up cached, about
    # 2 min more without; 2026-12-03); the 20-row algorithm table is its own command (README, ~3.5 h)
    ("headroom", ["study", "headroom", "--seeds", "0"]),
    ("omni", ["study", "omni"]),  # async vs colocate on the omni task (analysis/omni.py draws it)
    ("recovery", ["study", "recovery"]),  # kills (spare / cold rollout, reference, actor), DCS bench, elastic phases
    # SIMULATED: 16xH800 predictions beside the paper, scaling, staleness, split (78 s wall, load 1.4, 2026-12-04
    # 18:33; 26 s before the staleness sweep grew to 30 steps with a streaming column)
    ("sim", ["study", "sim"]),
    # EMULATED H800s: the real engine at the paper's shape, 5 schedules + beyond-the-paper, beside the simulator
    # (5 runs of 4 steps at 100x compression, beyond-the-paper, the faults run: 528 s measured on 2026-12-04
    # 18:23-18:32 with nothing else running, inside its 10-minute budget; 16m27s before the native stand-in model)
    ("emulate", ["study", "emulate"]),
]
# Reference folders measured by a separate command (too CPU-heavy for reproduce-fig), kept by --update-reference:
# smollm2/ = SmolLM2-135M-Instruct before/after GRPO (experiments/async/cpu-smollm2.yaml; see its README.md).
# headroom/ = the algorithm table (`relax study headroom`, 20 rows x 3 seeds, ~3.5 h; its README); reproduce-fig's own
# headroom study (GRPO, seed 0) is drawn from its results but never replaces the table.
# sim_gate/ = the simulator's first gate (python -m experiments.sim.gate_cpu --fresh: a profile and the 7 runs in one
# invocation, ~12 minutes; SIMULATED beside measured).
KEPT_REFERENCE = {"smollm2", "headroom", "sim_gate"}


def _fmt(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _names() -> list[str]:
    return [e[0] for e in EXPERIMENTS] + [s[0] for s in STUDIES]


def run_studies(names: list[str] | None = None, out: Path = RESULTS) -> list[Path]:
    """Run the studies (all, or those named); returns their folders OUT/<name>/."""
    import subprocess
    import sys

    done, failed = [], []
    for name, argv in STUDIES:
        if names and name not in names:
            continue
        cmd = [sys.executable, "-m", "relax.cli", *argv, "--out", str(out)]
        print(f"\n[study] {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        if rc:  # one failed study must not cost the others: report it, keep going, fail at the end
            print(f"    FAILED (exit {rc}) after {_fmt(time.time() - t0)}: {name} is left out", flush=True)
            failed.append(name)
            continue
        print(f"    {out / name} ({_fmt(time.time() - t0)})", flush=True)
        done.append(out / name)
    if failed:
        print(f"\nstudies that failed: {failed}", flush=True)
    return done


def run_all(names: list[str] | None = None, steps: int | None = None, out: Path = RESULTS) -> list[Path]:
    from experiments import launch
    from relax.run_folder import RunFolder

    unknown = set(names or []) - set(_names())
    if unknown:
        raise SystemExit(f"unknown experiment(s) {sorted(unknown)}; one of {_names()}")
    todo = [e for e in EXPERIMENTS if not names or e[0] in names]
    t_all, done = time.time(), []
    for i, (name, path, overrides) in enumerate(todo, 1):
        elapsed = time.time() - t_all
        eta = f", about {_fmt(elapsed / (i - 1) * (len(todo) - i + 1))} left" if i > 1 else ""
        print(f"\n[{i}/{len(todo)}] {name}: relax run {path} {' '.join(overrides)}  "
              f"(elapsed {_fmt(elapsed)}{eta})", flush=True)
        run_dir, summary = launch.run(ROOT / path, overrides, out=out, steps=steps, progress=True)
        print(f"    {run_dir}: {summary['mean_step_time_s']:.3f} s/step, {summary['steps_per_hour']:.0f} steps/h, "
              f"reward {summary['initial_reward']:.3f} -> {summary['final_reward']:.3f} "
              f"({_fmt(RunFolder(run_dir).host_load()['wall_s'])})", flush=True)
        done.append(run_dir)
    print(f"\nall {len(todo)} runs in {_fmt(time.time() - t_all)}")
    return done


def update_reference(run_dirs: list[Path], out: Path = RESULTS, reference: Path = REFERENCE,
                     studies: list[Path] = ()) -> Path:
    """Replace the committed reference set with these runs and studies (small files only: analysis/reference.py),
    all but the hand-measured folders (KEPT_REFERENCE), which reproduce-fig does not redo."""
    from analysis.reference import clear, copy_run, copy_study

    clear(reference, keep=KEPT_REFERENCE)
    for study in studies:  # a study's own small files: results json, per-run metrics and summaries
        if study.name in KEPT_REFERENCE:  # reproduce-fig's smaller set must not overwrite the measured table
            print(f"reference: {study.name}/ kept (measured by its own command); this run's is in {study}")
            continue
        copy_study(study, reference / study.relative_to(out))
    for run in run_dirs:
        copy_run(run, reference / run.relative_to(out))
    _write_readme(run_dirs, out, reference)
    size = sum(p.stat().st_size for p in reference.rglob("*") if p.is_file())
    print(f"reference set: {len(run_dirs)} runs, {size / 1e6:.2f} MB in {reference}")
    return reference


def _write_readme(run_dirs: list[Path], out: Path, reference: Path) -> None:
    from analysis.results import host_load, load_summary
    from relax.run_folder import git_commit

    lines = ["# Reference CPU-scale runs", "",
             "One full `make reproduce-fig` (`relax reproduce --update-reference`), kept so that",
             "`make figures` redraws every figure and table without rerunning (config.yaml, metrics.jsonl,",
             "summary.json, trace.json, host_load.json of each run; no weights).", "",
             f"Taken {time.strftime('%Y-%m-%d %H:%M')} at commit {git_commit(ROOT)}. veRL and OpenRLHF are schedules "
             "EMULATED in Relax (relax/schedules/), not those frameworks.", "",
             "| run | steps | step time (s) | steps/hour | host load, 1-min avg (before -> after) |",
             "|---|---|---|---|---|"]
    for run in run_dirs:
        s = load_summary(run)
        lines.append(f"| {run.relative_to(out)} | {s['steps']} | {s['mean_step_time_s']} | {s['steps_per_hour']} | "
                     f"{host_load(run)} |")
    lines += ["", "A load well above the core count means other work shared the cores while that run was timed: its "
              "times are inflated and the ratios built on them uncertain (load differs from run to run)."]
    (reference / "README.md").write_text("\n".join(lines) + "\n")


def main(args: argparse.Namespace) -> int:
    args.out = args.out or RESULTS
    runs = run_all(args.only, args.steps, args.out)
    studies = run_studies(args.only, args.out)
    if args.update_reference:
        update_reference(runs, args.out, studies=studies)
    if not args.no_figures:
        for fig in draw_all(args.out, args.out, only=runs):  # these runs, not older ones under --out
            print(fig)
    wanted = [n for n, _ in STUDIES if not args.only or n in args.only]
    if len(studies) < len(wanted):
        raise SystemExit(f"{len(wanted) - len(studies)} of {len(wanted)} studies failed (see above)")
    return 0
