"""The controller: starts the roles as Ray actors, runs the chosen schedule, and writes the run's results.

It only orchestrates (start, step counters, teardown); data moves between roles through the bus and
weights through the weight store. Results follow DESIGN.md section 7:
`<out>/<experiment>/<profile>/<run>/{config.yaml, metrics.jsonl, trace.json, summary.json}`.

Metrics go out live: every poll hands each new step's row, and every recovery, injected fault and finished
scale operation the supervisor has seen since, to the Reporter over `metrics.sinks` (relax/metrics/sinks.py).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

import psutil
import ray
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relax.api.scaling import TERMINAL as TERMINAL_SCALE
from relax.bus import Bus
from relax.config import ExperimentConfig, dump_config
from relax.metrics import processes
from relax.metrics.alerts import AlertSink
from relax.metrics.gpu import hardware_description
from relax.metrics.sinks import build_reporter
from relax.metrics.status import make_status
from relax.metrics.telemetry import Telemetry, busy_seconds, chrome_trace, cpu_seconds
from relax.models.warmup import warmup_state
from relax.schedules import get_schedule, is_emulated, role_names
from relax.schedules.context import RunContext, RunStopped
from relax.evaluate import eval_curve, greedy_accuracy, sampled_reward
from relax.fault.supervisor import Supervisor
from relax.cluster import RaySession
from relax.run_folder import RunFolder

log = logging.getLogger(__name__)


def nonfinite_account(rows: list[dict]) -> dict:
    """Steps skipped for a non-finite loss or gradient norm, and the samples they consumed without an update
    (their ids are in the ledger with the step's unchanged version: reported, not lost)."""
    skipped = [r for r in rows if r.get("skipped_nonfinite")]
    return {"steps_skipped_nonfinite": len(skipped), "samples_skipped_nonfinite": sum(r["samples"] for r in skipped)}


class MemoryMeter:
    """Peak proportional set size of the driver and every process it started (the whole Ray session), sampled every
    `every_s` on a thread of its own while in use (`with meter:`). Reading PSS costs ~5 ms a process (smaps), ~0.1 s
    of CPU for a run's ~20 processes: read every second it took 0.1 of a core, 5% of a 2-core machine, from the
    run it measured (on the driver's loop it had lengthened every colocate step by 0.1 s). So each tick reads the
    resident sets (statm, ~50 us a process) and reads PSS only when their sum has grown by over GROWTH past any sum
    seen at a PSS read, or `pss_every_s` has passed. With no more pages resident, PSS can grow only by shared pages
    turning private (copy-on-write after a fork: Ray spawns its workers, it does not fork them), which the periodic
    read still catches; the peak may read up to GROWTH low between those reads."""

    GROWTH = 0.01

    def __init__(self, every_s: float = 1.0, pss_every_s: float = 10.0):
        self.me = psutil.Process()
        self.peak = 0
        self.every_s = every_s
        self.pss_every_s = pss_every_s
        self.rss_read = -1  # the largest resident-set sum seen at a PSS read
        self.pss_at = float("-inf")  # when PSS was last read
        self.pss_reads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MemoryMeter:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="memory-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample(force=True)

    def _loop(self) -> None:
        self.sample()
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self, force: bool = False) -> None:
        procs, rss = [self.me, *self.me.children(recursive=True)], 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if not force and rss <= self.rss_read * (1 + self.GROWTH) and time.monotonic() - self.pss_at < self.pss_every_s:
            return
        total = 0
        for p in procs:
            try:
                info = p.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.rss_read, self.pss_at, self.pss_reads = max(self.rss_read, rss), time.monotonic(), self.pss_reads + 1
        self.peak = max(self.peak, total)


# metrics.jsonl times that emulated runs also give in emulated hardware seconds (row["emulated_hardware_s"])
HW_TIMES = ("wall_time_s", "step_time_s", "train_time_s", "trainer_wait_s", "weight_sync_s", "sleep_wake_s")


def emulated_summary(emu, rows: list[dict], steady: list[dict], train_s: float) -> dict:
    """summary.json `emulated_hardware`: what was emulated, and the throughput in emulated hardware seconds
    (real x compression) with the modelled tokens and bytes; `real_*` beside for the real seconds."""
    c = emu.compression
    tokens = sum(r.get("emulated_response_tokens", 0) for r in rows)
    step = sum(r["step_time_s"] for r in steady) / len(steady)
    work: dict[str, dict] = {}
    for r in rows:
        for kind, v in r.get("emulated_actor_work", {}).items():
            w = work.setdefault(kind, {"calls": 0, "modelled_s": 0.0, "overrun_s": 0.0})
            for key in w:
                w[key] += v[key]
    return {**emu.describe(),
            "train_time_s": round(train_s * c, 2), "mean_step_time_s": round(step * c, 3),
            "steps_per_hour": round(3600 * len(rows) / (train_s * c), 4),
            "tokens_per_s": round(tokens / (train_s * c), 2),
            "response_tokens_mean": round(tokens / max(sum(r["samples"] for r in rows), 1), 1),
            "modelled_bus_bytes": sum(r.get("emulated_bus_bytes", 0) for r in rows),
            "real_train_time_s": round(train_s, 3), "real_mean_step_time_s": round(step, 4),
            # the Actor's paced work: modelled seconds, and real seconds its real work ran past the model
            "actor_work": {k: {key: round(v, 4) for key, v in w.items()} for k, w in work.items()}}


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
        self.reporter = build_reporter(cfg, self.folder)  # metrics.sinks: every step and event, live
        self.spans_seen = 0  # spans fetched from telemetry so far
        self.recent_spans: list[dict] = []  # those that may still overlap a step not yet reported
        self.last_end: float | None = None  # end_time of the newest step reported
        self.reported: set = set()  # events already handed to the reporter
        # The alert rules (relax/metrics/alerts.py) are one more sink, fed the same steps and events.
        self.alerts = AlertSink(cfg.alerts, cfg.max_staleness, run=f"{cfg.name}/{self.folder.name}")
        self.reporter.sinks["alerts"] = self.alerts
        self.t_start: float | None = None  # the first step's start (set when the schedule starts)
        self.t_end: float | None = None  # the last step's end (set when the schedule returns)
        self.cpu_start = self.cpu_end = None  # psutil.cpu_times() at t_start and when the schedule returns
        self.procs_start = self.procs_end = None  # relax.metrics.processes snapshots at the same two points
        self.bus_calls: dict | None = None  # each process's bus operations by kind when the schedule returns
        self.rows: dict[int, dict] = {}  # step -> its row as the sinks got it (status.json's curve)
        self.all_spans: list[dict] = []  # every span fetched so far (status.json's live busy shares)
        self.status_at = 0.0  # when status.json was last written
        self.next_snapshot = cfg.task.eval_every  # the next version to keep for the eval curve (0: none)
        from relax.emulate import emulator

        self.emu = emulator(cfg)  # emulated GPUs (relax/emulate/): rows and summary also in hardware seconds

    # --- set-up ------------------------------------------------------------------------------------------
    def start_roles(self, initial_state) -> None:
        cfg = self.cfg
        # TQ starts its controller and then its storage, each process on one core, on a thread of its own:
        # Telemetry's, the DCS coordinator's and the roles' processes start meanwhile (Supervisor.start waits for TQ).
        self.telemetry = Telemetry.remote()
        dcs = Supervisor.start_dcs(cfg)
        self.bus = Bus.start(cfg.bus, cfg.rollout.group_size, cfg.max_staleness, wait=False)
        # What the supervisor and the schedule see of this run (the dicts are the controller's own).
        self.ctx = RunContext(cfg, self.run_dir, self.bus, self.telemetry, self.names, self.roles,
                              self.records, self.poll, self.colocate_extra)
        # DCS (weights, version 0 = initial_state), the roles and rollout replicas, faults, recovery, API.
        self.supervisor = Supervisor(self.ctx, self.api_port)
        self.supervisor.start(initial_state, dcs)

    # --- metrics -----------------------------------------------------------------------------------------
    def poll(self, bar) -> None:
        spans, steps = ray.get(self.telemetry.snapshot.remote(self.spans_seen))
        self.spans_seen += len(spans)
        self.recent_spans += spans
        self.all_spans += spans
        for k in sorted(steps):
            if k not in self.records:
                self.records[k] = steps[k]
                bar.update(self.task_id, advance=1, reward=steps[k]["reward_mean"])
                self.report_step(k)
        self.report_events()
        self.snapshot_weights()
        if time.time() - self.status_at >= 1.0:
            self.write_status("running")

    def snapshot_weights(self) -> None:
        """Keep the next task.eval_every-th version's weights in snapshots/ once its step is done and the DCS has
        committed it (a newer one if the holders moved on); the eval curve evaluates them after the run."""
        due, cfg = self.next_snapshot, self.cfg
        if not due or not cfg.task.eval_size or due >= cfg.steps or due - 1 not in self.records:
            return
        if due not in self.supervisor.dcs.topology()["committed"]:
            return
        from relax.export import save_weights

        version, state = self.supervisor.dcs.latest_state(min_version=due)
        save_weights(self.folder.snapshot_path(version), state, version)
        self.next_snapshot = (version // cfg.task.eval_every + 1) * cfg.task.eval_every

    def row(self, k: int, prev_end: float, spans: list[dict]) -> dict:
        """Step k's metrics.jsonl row: its record, its time, and each role's busy seconds and share of it."""
        rec = dict(self.records[k])
        end = rec.pop("end_time")
        step_s = end - prev_end
        busy = busy_seconds(spans, prev_end, end, self.names)
        row = {"step": k, "wall_time_s": round(end - self.t_start, 4), "step_time_s": round(step_s, 4),
               **{key: v for key, v in rec.items() if key != "step"}, "busy_s": busy,
               # this machine's CPU seconds in each role's spans (real seconds, never compressed): beside busy_s
               "cpu_s": cpu_seconds(spans, prev_end, end, self.names),
               "busy_share": {n: round(b / step_s, 4) if step_s > 0 else 0.0 for n, b in busy.items()},
               **self.colocate_extra.get(k, {})}
        if self.emu is not None:  # the same times in emulated hardware seconds (compression undone)
            c = self.emu.compression
            row["emulated_hardware_s"] = {key: round(row[key] * c, 3) for key in HW_TIMES if key in row} | \
                {"busy_s": {n: round(b * c, 3) for n, b in busy.items()}}
        return row

    def report_step(self, k: int) -> None:
        # Live: from the spans received by now (roles ship them in batches, so a role's newest ones may not be
        # here yet and its busy share reads low); write_metrics recounts every step from all spans at the end.
        prev = self.last_end if self.last_end is not None else self.t_start
        row = self.row(k, prev, self.recent_spans)
        self.last_end = self.records[k]["end_time"]
        self.recent_spans = [s for s in self.recent_spans if s["end"] > self.last_end]
        self.ctx.live["row"] = row
        self.rows[k] = row
        self.reporter.step(k, {key: v for key, v in row.items() if key != "step"})

    def report_events(self, final: bool = False) -> None:
        """Hand the reporter what happened since the last poll, each once: injected faults as they fire
        ("fault"), missed heartbeats ("heartbeat_timeout"), recoveries once the replacement is ready or the run
        ends ("recovery"), and scale operations once finished ("scale")."""
        sup = getattr(self, "supervisor", None)
        if sup is None:
            return
        found = [(("fault", i), "fault", {k: v for k, v in f.items() if k != "matched"}
                  | {"t_fault": f["t_fault"] - sup.t_start}) for i, f in enumerate(sup.injector.fired)]
        for i, ev in enumerate(sup.events):
            if "kind" in ev:
                found.append((("event", i), ev["kind"], ev))
            elif final or "t_ready" in ev or ev.get("superseded_by_global_restart"):
                found.append((("event", i), "recovery", ev))
        if sup.api is not None:
            found += [(("scale", op["request_id"]), "scale", op) for op in sup.scaler.views()
                      if op["status"] in TERMINAL_SCALE or final]
        for key, kind, payload in found:
            if key not in self.reported:
                self.reported.add(key)
                # plain JSON data, the same for every sink; steps_done: where in the run it happened
                self.reporter.event(kind, {"steps_done": len(self.records), **json.loads(json.dumps(payload, default=str))})

    def write_status(self, state: str, error: str | None = None) -> None:
        """status.json: what `relax status` and the API's /status and /view show while the run goes on."""
        self.status_at = time.time()
        sup = getattr(self, "supervisor", None)
        end = self.t_end or time.time()
        elapsed = None if self.t_start is None else end - self.t_start
        busy = {}
        if elapsed:
            busy = {n: v / elapsed for n, v in busy_seconds(self.all_spans, self.t_start, end, self.names).items()}
        rows = [self.rows[k] for k in sorted(self.rows)]
        alerts = {"active": [vars(a) for a in self.alerts.active], "history": [vars(a) for a in self.alerts.history],
                  "delivery_errors": self.alerts.delivery_errors}
        scaler = getattr(sup, "scaler", None) if sup is not None and sup.api is not None else None
        self.folder.write_status(make_status(
            self.folder, {"name": self.cfg.name, "mode": self.cfg.mode, "steps": self.cfg.steps}, state,
            len(self.records), rows, elapsed, busy, sup.events if sup else [], sup.injector.fired if sup else [],
            scaler.views() if scaler else [], alerts, error))

    def write_metrics(self, spans: list[dict]) -> list[dict]:
        rows, prev_end = [], self.t_start
        for k in sorted(self.records):
            rows.append(self.row(k, prev_end, spans))
            prev_end = self.records[k]["end_time"]
        self.folder.write_metrics(rows)
        return rows

    def host_cpu_cores(self) -> float | None:
        """Mean cores busy on this machine (user + nice + system, every process) from the first step's start to
        the run's end (read at the end of the schedule's loop, just past the last step)."""
        t0, t1 = self.cpu_start, self.cpu_end
        if t0 is None or t1 is None:
            return None
        d = {f: getattr(t1, f) - getattr(t0, f) for f in t1._fields}
        busy = d["user"] + d["nice"] + d["system"]
        # every CPU's seconds, idle included; guest time is already inside user and nice (Linux)
        wall = sum(d.values()) - d.get("guest", 0.0) - d.get("guest_nice", 0.0)
        return round(busy / wall * (os.cpu_count() or 1), 3) if wall > 0 else None

    def write_summary(self, rows: list[dict], t_start: float, spans: list[dict], account: list[int],
                      evals: dict) -> dict:
        cfg = self.cfg
        train_s = rows[-1]["wall_time_s"]
        steady = rows[1:] or rows  # step 0 includes pipeline fill
        step_time = sum(r["step_time_s"] for r in steady) / len(steady)
        busy_total = busy_seconds(spans, t_start, t_start + train_s, self.names)
        busy_per_step = {n: sum(r["busy_s"][n] for r in steady) / len(steady) for n in self.names}
        cpu_per_step = {n: sum(r["cpu_s"][n] for r in steady) / len(steady) for n in self.names}
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
            # CPU seconds each role's process spent in its spans per step, and the machine's busy cores over the
            # training (every process: roles, bus, Ray, the driver): with busy_per_step_s they say whether a
            # role's work grew or it waited for a core
            "cpu_per_step_s": {n: round(v, 4) for n, v in cpu_per_step.items()},
            "host_cpu_cores": self.host_cpu_cores(),
            # ...and how those cores split by process (relax/metrics/processes.py): core-seconds per step over the
            # whole training, step 0 included, of the driver, each Ray actor class and each Ray daemon
            "cpu_by_process_per_step_s": processes.cpu_by_process(self.procs_start, self.procs_end, len(rows))
            if self.procs_start is not None and self.procs_end is not None else None,
            # ...and the bus operations per step that went with them, by process and kind (relax.bus.Bus.calls:
            # put, write, fetch, empty_fetch, wait), over the whole training, step 0 included
            "bus_calls_per_step": {p: {k: round(n / len(rows), 3) for k, n in sorted(c.items())}
                                   for p, c in self.bus_calls.items()} if self.bus_calls else None,
            # Throughput against the bound set by the slowest role: 1.0 means that role never idles.
            "pipeline_efficiency": round(slowest / step_time, 4),
            "peak_memory_mb": round(self.memory.peak / 2**20, 1),
            "samples_trained": len(account),
            "samples_lost": len(expected - set(account)),
            "samples_duplicated": len(account) - len(set(account)),
            **nonfinite_account(rows),
            "backends": getattr(getattr(self, "supervisor", None), "backends", {}),  # what ran each role
            # metrics.sinks, and those that failed during the run (name -> the error that turned it off)
            "metrics_sinks": list(cfg.metrics.sinks), "metrics_sinks_failed": dict(self.reporter.failed),
            # wall seconds each sink's calls took in the driver's poll, over the run (close included)
            "metrics_sinks_s": {n: round(v, 4) for n, v in self.reporter.seconds.items()},
            "environment": {"cpus": os.cpu_count(), "torch": torch.__version__, "ray": ray.__version__,
                            "python": platform.python_version(), "machine": platform.machine(),
                            # the kernels torch picked (AVX512, AVX2, ...): a seed's warm-up is bit-identical
                            # when redone on one machine, and was not on another; this says what differed
                            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "hardware": hardware_description(
                                f"{self.emu.cost.hw.name} ({self.emu.describe()['gpus']})" if self.emu else None)},
        }
        if self.emu is not None:
            summary["emulated_hardware"] = emulated_summary(self.emu, rows, steady, train_s)
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
        self.folder.write_config(dump_config(self.cfg))
        self.write_status("starting")
        try:
            summary = self._run()
        except BaseException as err:
            try:
                self.close_reporter()  # a run that failed (warm-up, start-up, a role) closes its sinks too
                state = "stopped" if isinstance(err, RunStopped) else "failed"
                self.write_status(state, f"{type(err).__name__}: {err}")
            except Exception:  # noqa: BLE001 -- never hide the run's own error
                log.exception("could not write the failed run's status")
            raise
        self.write_status("finished")
        return summary

    def _run(self) -> dict:
        cfg = self.cfg
        state = warmup_state(cfg, progress=self.progress)
        error: RunStopped | None = None
        with RaySession(num_cpus=max(8, os.cpu_count() or 2)):
            try:
                self.start_roles(state)
                columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn()]
                with Progress(*columns, disable=not self.progress, transient=False) as bar, self.memory:
                    label = cfg.mode if cfg.schedule == "relax" else f"{cfg.schedule} schedule, EMULATED"
                    if self.emu is not None:
                        label += f", EMULATED {self.emu.cost.hw.name} GPUs at {self.emu.compression:g}x"
                    self.task_id = bar.add_task(f"{cfg.name} [{label}]", total=cfg.steps, reward=0.0)
                    self.procs_start = processes.snapshot()  # before t_start: its own ~20 ms is not the run's
                    self.t_start, self.cpu_start = time.time(), psutil.cpu_times()
                    try:
                        get_schedule(cfg).run(self.ctx, self.supervisor, bar)  # relax/schedules/
                    except ray.exceptions.RayTaskError as err:  # a role stopped the run: keep what it did
                        error = RunStopped(str(err.cause if err.cause is not None else err).strip(), self.run_dir)
                    except RunStopped as err:  # an operator did (POST /run/stop)
                        error = err
                    self.poll(bar)
                spans = ray.get(self.telemetry.all_spans.remote())
                self.all_spans = spans
                self.t_end = max((r["end_time"] for r in self.records.values()), default=time.time())
                self.cpu_end = psutil.cpu_times()
                self.procs_end = processes.snapshot()
                self.bus_calls = self.supervisor.bus_calls()
                if error is not None and error.requested:
                    # the roles still run: the last step seen commits its version within seconds
                    account = self.supervisor.account(max(self.records, default=-1) + 1)
                elif error is not None:
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
                self.close_reporter()  # held alert messages go out; every sink closes
        self.folder.write_trace(chrome_trace(spans, self.t_start))
        rows = self.write_metrics(spans)
        if error is not None:
            self.write_stopped_summary(rows, account, error)
            raise error
        # Greedy accuracy on held-out prompts, before and after RL (the warm-up start vs the trained policy).
        evals = {"eval_accuracy_start": greedy_accuracy(cfg, state),
                 "eval_accuracy_end": greedy_accuracy(cfg, final_state),
                 "eval_reward_start": sampled_reward(cfg, state), "eval_reward_end": sampled_reward(cfg, final_state)}
        if cfg.task.eval_every:
            evals["eval_curve"] = eval_curve(cfg, self.folder.snapshots(), rows, evals["eval_accuracy_start"],
                                             evals["eval_accuracy_end"])
        return self.write_summary(rows, self.t_start, spans, account, evals)

    def close_reporter(self) -> None:
        """Every event seen up to the end (recoveries still in progress too), then each sink closes."""
        try:
            self.report_events(final=True)
        finally:
            self.reporter.close()


def run_experiment(cfg: ExperimentConfig, out: str | Path = "results", run: str | None = None,
                   progress: bool = True, api_port: int | None = None) -> tuple[Path, dict]:
    from relax.preflight import preflight

    if cfg.emulate.hardware is not None:  # emulated GPUs: the CPU stand-ins run, the target prices the work
        from relax.emulate import engine_config

        cfg = engine_config(cfg)
    preflight(cfg, api_port)  # every check a run can fail (relax/preflight.py), before any folder or Ray
    run_dir = RunFolder.create(out, cfg.name, cfg.profile, run).path
    return run_dir, Controller(cfg, run_dir, progress, api_port).run()
