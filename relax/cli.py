"""`relax` command line: run experiments, warm up models, evaluate, export, scale, stop.

The harness's commands (`relax report`, `relax baseline`, `relax study`, `relax figures`, `relax reproduce`,
`relax bench`, ...) come from the `relax.commands` entry points (pyproject.toml): each is a function that adds
its sub-command to the parser, so the engine never imports analysis/, baselines/ or experiments/.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points
from pathlib import Path

from relax.config import ConfigError, load_config


def _load(args):
    overrides = list(args.overrides)
    if getattr(args, "steps", None) is not None:
        overrides.append(f"steps={args.steps}")
    if getattr(args, "emulate", None) is not None:
        overrides.append(f"emulate.hardware={args.emulate}")
    if getattr(args, "compression", None) is not None:
        overrides.append(f"emulate.compression={args.compression}")
    return load_config(args.config, overrides)


def cmd_run(args) -> int:
    cfg = _load(args)
    if getattr(args, "dry_run", False):
        from relax.plan import format_plan, resolve_plan

        plan = resolve_plan(cfg)
        print(json.dumps(plan, indent=2) if args.json else format_plan(plan), end="\n" if args.json else "")
        return 0
    from relax.controller import run_experiment

    run_dir, summary = run_experiment(cfg, out=args.out, run=args.run, progress=not args.no_progress,
                                      api_port=args.api_port)
    if "emulated_hardware" in summary:
        e = summary["emulated_hardware"]
        print(f"EMULATED {e['hardware']} GPUs {e['gpus']} at {e['compression']:g}x compression: "
              f"{e['mean_step_time_s']:.1f} emulated s/step ({e['real_mean_step_time_s']:.2f} real s), "
              f"{e['steps_per_hour']:.2f} steps/hour, {e['tokens_per_s']:.0f} tokens/s (synthetic tokens)")
    keys = ["steps", "steps_per_hour", "mean_step_time_s", "initial_reward", "final_reward",
            "eval_accuracy_start", "eval_accuracy_end", "eval_reward_start", "eval_reward_end", "staleness_max",
            "pipeline_efficiency", "trainer_wait_share", "peak_memory_mb", "samples_lost", "samples_duplicated"]
    print(json.dumps({k: summary[k] for k in keys if k in summary}, indent=2))
    print(f"results: {run_dir}")
    return 0


def cmd_sft(args) -> int:
    cfg = _load(args)
    from relax.evaluate import greedy_accuracy
    from relax.models.warmup import warmup_state

    state = warmup_state(cfg)
    print(json.dumps({"eval_accuracy": greedy_accuracy(cfg, state)}))
    return 0


def cmd_validate(args) -> int:
    """Exactly the checks `relax run` makes before it starts anything (relax/preflight.py)."""
    from relax.config import dump_config
    from relax.preflight import preflight

    cfg = _load(args)
    preflight(cfg, args.api_port)
    print(dump_config(cfg), end="")
    return 0


def cmd_export(args) -> int:
    from relax.export import ExportError, export_run

    try:
        check = export_run(args.run_dir, args.to)
    except ExportError as err:
        print(f"relax export: {err}", file=sys.stderr)
        return 2
    print(json.dumps(check, indent=2))
    return 0


def cmd_evaluate(args) -> int:
    import time

    import torch

    from relax.evaluate import evaluate_run

    torch.set_num_threads(args.threads)
    t0 = time.time()
    res = {**evaluate_run(args.run_dir, args.sampled, args.eval_size), "seconds": round(time.time() - t0, 1)}
    (args.run_dir / "eval.json").write_text(json.dumps(res, indent=2))
    print(json.dumps(res))
    return 0


def cmd_status(args) -> int:
    """A run's progress, reward curve, utilisation, recoveries, scale operations and alerts (relax/metrics/status.py):
    from status.json while it goes on, from its result files once it ended."""
    import time

    from rich.console import Console
    from rich.live import Live

    from relax.metrics.status import read_status, render, view_url

    def load():
        try:
            return read_status(args.run_dir)
        except (FileNotFoundError, ValueError) as err:  # ValueError: a file that is not JSON
            print(f"relax status: {err}", file=sys.stderr)
            return None

    status = load()
    if status is None:
        return 2
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    console = Console()
    url = view_url(args.run_dir) if status["state"] in ("starting", "running") else None
    if args.watch is None:
        console.print(render(status))
        if url:
            console.print(f"live view: {url}")
        return 0
    with Live(render(status), console=console, refresh_per_second=4) as live:
        while status["state"] in ("starting", "running"):
            time.sleep(args.watch)
            status = load() or status
            live.update(render(status))
    return 0


def add_harness_commands(sub) -> None:
    """The sub-commands other packages register under the `relax.commands` entry point group (one per name:
    the first installation found on the path wins, as for an import)."""
    seen = set()
    for ep in entry_points(group="relax.commands"):
        if ep.name in seen:
            continue
        seen.add(ep.name)
        try:
            register = ep.load()
        except ImportError as err:  # e.g. installed without the harness's own dependencies
            print(f"relax: command {ep.name!r} unavailable: {err}", file=sys.stderr)
            continue
        register(sub)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relax", description="Relax: asynchronous RL post-training engine")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment (YAML config + key=value overrides)")
    run.add_argument("config")
    run.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.temperature=0.7")
    run.add_argument("--steps", type=int, help="number of training steps (overrides `steps`)")
    run.add_argument("--out", default="results", help="results root (default: results)")
    run.add_argument("--run", help="run folder name (default: timestamp)")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument("--api-port", type=int, help="serve the control API (elastic scaling) on this port (0: any "
                     "free one); token in <run_dir>/api_token, address in <run_dir>/api.json")
    run.add_argument("--dry-run", action="store_true",
                     help="print the resolved cluster plan (roles, GPUs, placement groups, backends, launch commands)")
    run.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    run.add_argument("--emulate", metavar="HARDWARE", help="emulated GPUs: the real engine on this machine, each unit "
                     "of GPU work taking the cost model's time on this profile (relax/sim/hardware/), compressed "
                     "(the `emulate` section)")
    run.add_argument("--compression", type=float, help="with --emulate: emulated seconds per real second (default 200)")
    run.set_defaults(func=cmd_run)

    sft = sub.add_parser("sft", help="supervised warm-up for a config (cached) and its greedy eval accuracy")
    sft.add_argument("config")
    sft.add_argument("overrides", nargs="*")
    sft.set_defaults(func=cmd_sft)

    val = sub.add_parser("validate", help="run every check `relax run` makes before it starts (relax/preflight.py); "
                         "print the config resolved")
    val.add_argument("config")
    val.add_argument("overrides", nargs="*")
    val.add_argument("--steps", type=int, help="as for `relax run`")
    val.add_argument("--api-port", type=int, help="as for `relax run`: check the control API can listen there")
    val.set_defaults(func=cmd_validate)

    exp = sub.add_parser("export", help="export a run's final weights as a Hugging Face folder")
    exp.add_argument("run_dir", metavar="RUN_DIR")
    exp.add_argument("--to", required=True, metavar="DIR", help="output folder (safetensors, config, tokenizer)")
    exp.set_defaults(func=cmd_export)

    from relax.api.cli import register as register_scale

    register_scale(sub)
    from relax.sim.cli import register as register_simulate; register_simulate(sub)

    ev = sub.add_parser("evaluate", help="held-out accuracy of a run's warm-up start and final weights "
                        "(writes RUN_DIR/eval.json)")
    ev.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    ev.add_argument("--sampled", action="store_true", help="also the sampled reward (4 samples per prompt)")
    ev.add_argument("--eval-size", type=int, default=None, help="eval prompts (default: the run's task.eval_size)")
    ev.add_argument("--threads", type=int, default=1)
    ev.set_defaults(func=cmd_evaluate)

    st = sub.add_parser("status", help="a run's progress, rewards, utilisation, recoveries and alerts, live or finished")
    st.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    st.add_argument("--json", action="store_true", help="the status as JSON (the API's /status)")
    st.add_argument("--watch", type=float, metavar="SECONDS", help="redraw every SECONDS until the run ends")
    st.set_defaults(func=cmd_status)

    add_harness_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`run CFG --steps 8 a.b=1`): argparse leaves the ones
    # after an option unparsed, so collect them here.
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"relax: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        from relax.controller import RunStopped

        if not isinstance(err, RunStopped):
            raise
        print(f"relax: run stopped: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
