"""`relax study NAME ...` and `relax bench NAME ...`: the harness's commands, registered through the
`relax.commands` entry points (pyproject.toml), so relax/cli.py never imports the harness.

Each study or benchmark module has `add_arguments(parser)` and `main(args) -> exit code`; it is imported only
when its command runs (a study pulls in torch and the engine).
"""

from __future__ import annotations

import argparse
import importlib

STUDIES = {
    "r3_moe": "experiments.r3_moe.study",  # R3 overhead and mismatch, R3 off / on runs
    "omni": "experiments.omni.study",  # async vs colocate on the omni task
    "recovery": "experiments.recovery.study",  # kills, DCS bench, elastic phases
    "sim": "experiments.sim.study",  # SIMULATED: the paper's 16xH800 numbers and beyond (cost model + SimPy)
    "headroom": "experiments.headroom.study",  # the algorithm table: held-out accuracy gains from a warm start, seeds
    "emulate": "experiments.emulate.study",  # EMULATED H800s: the real engine in the cost model's time, beside the sim
}
BENCHES = {
    "dcs": "experiments.recovery.dcs_bench",  # DCS weight sync against a raw gloo broadcast
    "streaming": "experiments.streaming.bench",  # continuous batching against chunked generate
    "bus": "experiments.bus.bench",  # bus put/get throughput against memcpy and Ray's object store
    "sinks": "experiments.sinks.bench",  # step time with every metrics sink on against them off, side by side
    "old_log_probs": "experiments.old_log_probs.bench",  # ActorFwd's old log-probs against the rollout's: cost, mismatch
}


def run_study(module: str, prog: str, argv: list[str]) -> int:
    """Parse `argv` with the module's own arguments and run its `main`."""
    mod = importlib.import_module(module)
    p = argparse.ArgumentParser(prog=prog, description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mod.add_arguments(p)
    args = p.parse_args(argv)
    args.argv = list(argv)
    return mod.main(args) or 0


def _register(subparsers, command: str, modules: dict[str, str], help: str) -> None:
    p = subparsers.add_parser(command, help=help, description=f"{help}. `relax {command} NAME --help` for a "
                              "NAME's own options.")
    p.add_argument("name", choices=list(modules))
    p.add_argument("args", nargs=argparse.REMAINDER, help="NAME's own options")
    p.set_defaults(func=lambda a: run_study(modules[a.name], f"relax {command} {a.name}", a.args))


def register_study(subparsers) -> None:
    _register(subparsers, "study", STUDIES, "run one of the paper's studies (several runs and measurements), "
              "writing under results/<study>/")


def register_bench(subparsers) -> None:
    _register(subparsers, "bench", BENCHES, "a micro-benchmark (dcs: weight sync against the raw broadcast; "
              "bus: put/get throughput; sinks: the metrics sinks' cost to step time; old_log_probs: ActorFwd against the "
              "rollout's log-probs)")
