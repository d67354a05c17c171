"""The controller: starts the roles as Ray actors, runs the chosen schedule, and writes the run's results.

It only orchestrates (start, step counters, teardown); data moves between roles through the bus and
weights through the weight store. Results follow DESIGN.md section 7:
`<out>/<experiment>/<profile>/<run>/{config.yaml, metrics.jsonl, trace.json, summary.json}`.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from pathlib import Path

import psutil
import ray
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relax.bus import Bus
from relax.config import ExperimentConfig, dump_config
from relax.metrics.telemetry import Telemetry, busy_seconds, chrome_trace
from relax.models.warmup import warmup_state
from relax.schedules import get_schedule, is_emulated, role_names
from relax.schedules.context import RunContext
from relax.evaluate import greedy_accuracy, sampled_reward
from relax.fault.supervisor import Supervisor
from relax.cluster import RaySession
from relax.run_folder import RunFolder

log = logging.getLogger(__name__)


class RunStopped(RuntimeError):
    """A role stopped the run (e.g. training.max_nonfinite_steps); the results so far are in `run_dir`."""

    def __init__(self, message: str, run_dir: Path):
        super().__init__(f"{message} (results so far in {run_dir})")
        self.run_dir = run_dir


def nonfinite_account(rows: list[dict]) -> dict:
    """Steps skipped for a non-finite loss or gradient norm, and the samples they consumed without an update
    (their ids are in the ledger with the step's unchanged version: reported, not lost)."""
    skipped = [r for r in rows if r.get("skipped_nonfinite")]
    return {"steps_skipped_nonfinite": len(skipped), "samples_skipped_nonfinite": sum(r["samples"] for r in skipped)}


class MemoryMeter:
    """Peak proportional set size of the driver and every process it started (the whole Ray session)."""

    def __init__(self):
        self.me = psutil.Process()
        self.peak = 0

    def sample(self) -> None:
        total = 0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                info = p.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak = max(self.peak, total)


class Controller:
    def __init__(self, cfg: ExperimentConfig, run_dir: Path, progress: bool = True, api_port: int | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.folder = RunFolder(run_dir)
        self.names = role_names(cfg)  # the services this run starts (relax/roles/registry.py, less the schedule's)
        self.progress = progress
        self.api_port = api_port  # the control API (relax/api/) listens here when set (0: any free port)
        self.roles: dict[str, ray.actor.ActorHandle] = {}
        self.records: dict[int, dict] = {}
        self.colocate_extra: dict[int, dict] = {}
        self.memory = MemoryMeter()

    # --- set-up ------------------------------------------------------------------------------------------
    def start_roles(self, initial_state) -> None:
        cfg = self.cfg
        self.bus = Bus.start(cfg.bus, cfg.rollout.group_size, cfg.max_staleness)
        self.telemetry = Telemetry.remote()
        # What the supervisor and the schedule see of this run (the dicts are the controller's own).
        self.ctx = RunContext(cfg, self.run_dir, self.bus, self.telemetry, self.names, self.roles,
                              self.records, self.poll, self.colocate_extra)
        # DCS (weights, version 0 = initial_state), the roles and rollout replicas, faults, recovery, API.
        self.supervisor = Supervisor(self.ctx, self.api_port)
        self.supervisor.start(initial_state)

    # --- metrics -----------------------------------------------------------------------------------------
    def poll(self, bar) -> None:
        self.memory.sample()
        _, steps = ray.get(self.telemetry.snapshot.remote(10**9))
        for k in sorted(steps):
            if k not in self.records:
                self.records[k] = steps[k]
                bar.update(self.task_id, advance=1, reward=steps[k]["reward_mean"])

    def write_metrics(self, t_start: float, spans: list[dict]) -> list[dict]:
        rows, prev_end = [], t_start
        for k in sorted(self.records):
            rec = dict(self.records[k])
            end = rec.pop("end_time")
            rows.append({"step": k, "wall_time_s": round(end - t_start, 4), "step_time_s": round(end - prev_end, 4),
                         **{key: v for key, v in rec.items() if key != "step"},
                         "busy_s": busy_seconds(spans, prev_end, end, self.names), **self.colocate_extra.get(k, {})})
            prev_end = end
        self.folder.write_metrics(rows)
        return rows

    def write_summary(self, rows: list[dict], t_start: float, spans: list[dict], account: list[int],
                      evals: dict) -> dict:
        cfg = self.cfg
        train_s = rows[-1]["wall_time_s"]
        steady = rows[1:] or rows  # step 0 includes pipeline fill
        step_time = sum(r["step_time_s"] for r in steady) / len(steady)
        busy_total = busy_seconds(spans, t_start, t_start + train_s, self.names)
        busy_per_step = {n: sum(r["busy_s"][n] for r in steady) / len(steady) for n in self.names}
        slowest = max(busy_per_step.values())
        expected = set(range(cfg.steps * cfg.rows_per_step))
        tail = rows[-max(1, len(rows) // 4):]
        summary = {
            "experiment": cfg.name, "profile": cfg.profile, "mode": cfg.mode, "max_staleness": cfg.max_staleness,
            # relax, or the veRL / OpenRLHF schedule EMULATED with our kernels (relax/schedules/)
            "schedule": cfg.schedule, "emulated": is_emulated(cfg.schedule),
            "steps": len(rows),
            "train_time_s": round(train_s, 3),
            "steps_per_hour": round(3600 * len(rows) / train_s, 3),
            "tokens_per_s": round(sum(r["tokens"] for r in rows) / train_s, 3),
            "samples_per_s": round(sum(r["samples"] for r in rows) / train_s, 3),
            "mean_step_time_s": round(step_time, 4),
            "initial_reward": rows[0]["reward_mean"],
            "final_reward": sum(r["reward_mean"] for r in tail) / len(tail),
            **evals,
            "staleness_max": max(r["staleness_max"] for r in rows),
            "trainer_wait_share": round(sum(r["trainer_wait_s"] for r in steady) / sum(r["step_time_s"] for r in steady), 4),
            "busy_share": {n: round(v / train_s, 4) for n, v in busy_total.items()},
            "busy_per_step_s": {n: round(v, 4) for n, v in busy_per_step.items()},
            # Throughput against the bound set by the slowest role: 1.0 means that role never idles.
            "pipeline_efficiency": round(slowest / step_time, 4),
            "peak_memory_mb": round(self.memory.peak / 2**20, 1),
            "samples_trained": len(account),
            "samples_lost": len(expected - set(account)),
            "samples_duplicated": len(account) - len(set(account)),
            **nonfinite_account(rows),
            "backends": getattr(getattr(self, "supervisor", None), "backends", {}),  # what ran each role
            "environment": {"cpus": os.cpu_count(), "torch": torch.__version__, "ray": ray.__version__,
                            "python": platform.python_version(), "machine": platform.machine(),
                            "hardware": f"{os.cpu_count()}-core CPU, no GPU"},
        }
        if self.colocate_extra:
            summary["sleep_wake_s_mean"] = round(
                sum(v["sleep_wake_s"] for v in self.colocate_extra.values()) / len(self.colocate_extra), 4)
        self.folder.write_summary(summary)
        return summary

    def write_stopped_summary(self, rows: list[dict], account: list[int], error: RunStopped) -> dict:
        """summary.json of a run a role stopped: the error, the steps done and the account of their samples."""
        done = {r["step"] for r in rows}
        expected = {s for k in done for s in range(k * self.cfg.rows_per_step, (k + 1) * self.cfg.rows_per_step)}
        summary = {"experiment": self.cfg.name, "profile": self.cfg.profile, "mode": self.cfg.mode,
                   "schedule": self.cfg.schedule, "error": str(error), "steps": len(rows), "steps_planned": self.cfg.steps,
                   "samples_trained": len(account),
                   # over the steps that ran (the rest never started): trained or reported, never lost
                   "samples_lost": len(expected - set(account)),
                   "samples_duplicated": len(account) - len(set(account)), **nonfinite_account(rows),
                   "backends": getattr(getattr(self, "supervisor", None), "backends", {})}
        self.folder.write_summary(summary)
        return summary

    # --- entry point -------------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.folder.write_config(dump_config(cfg))
        state = warmup_state(cfg, progress=self.progress)
        error: RunStopped | None = None
        with RaySession(num_cpus=max(8, os.cpu_count() or 2)):
            try:
                self.start_roles(state)
                columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn()]
                with Progress(*columns, disable=not self.progress, transient=False) as bar:
                    label = cfg.mode if cfg.schedule == "relax" else f"{cfg.schedule} schedule, EMULATED"
                    self.task_id = bar.add_task(f"{cfg.name} [{label}]", total=cfg.steps, reward=0.0)
                    t_start = time.time()
                    try:
                        get_schedule(cfg).run(self.ctx, self.supervisor, bar)  # relax/schedules/
                    except ray.exceptions.RayTaskError as err:  # a role stopped the run: keep what it did
                        error = RunStopped(str(err.cause if err.cause is not None else err).strip(), self.run_dir)
                    self.poll(bar)
                spans = ray.get(self.telemetry.all_spans.remote())
                if error is not None:
                    account = self.supervisor.account(self.supervisor.dcs.topology()["latest"])
                else:
                    final_state = self.supervisor.final_state()[1]
                    account = self.supervisor.account()  # the DCS ledger: sample ids of committed versions
                    from relax.export import save_final_weights  # `relax export RUN_DIR --to DIR` reads it
                    save_final_weights(self.run_dir, final_state)
            finally:
                if hasattr(self, "supervisor"):
                    self.supervisor.shutdown()  # writes recovery.json, stops the API and every role
                if hasattr(self, "bus"):
                    self.bus.close()
        self.folder.write_trace(chrome_trace(spans, t_start))
        rows = self.write_metrics(t_start, spans)
        if error is not None:
            self.write_stopped_summary(rows, account, error)
            raise error
        # Greedy accuracy on held-out prompts, before and after RL (the warm-up start vs the trained policy).
        evals = {"eval_accuracy_start": greedy_accuracy(cfg, state), "eval_accuracy_end": greedy_accuracy(cfg, final_state),
                 "eval_reward_start": sampled_reward(cfg, state), "eval_reward_end": sampled_reward(cfg, final_state)}
        return self.write_summary(rows, t_start, spans, account, evals)


def run_experiment(cfg: ExperimentConfig, out: str | Path = "results", run: str | None = None,
                   progress: bool = True, api_port: int | None = None) -> tuple[Path, dict]:
    from relax.preflight import preflight

    preflight(cfg, api_port)  # every check a run can fail (relax/preflight.py), before any folder or Ray
    run_dir = RunFolder.create(out, cfg.name, cfg.profile, run).path
    return run_dir, Controller(cfg, run_dir, progress, api_port).run()
