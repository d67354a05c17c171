"""The run folder, `results/<experiment>/<profile>/<run>/` (DESIGN.md section 7): the one module that knows
its file names and formats. The controller writes through it; analysis, studies and baselines read through it.

| file | written by | content |
|---|---|---|
| config.yaml | controller | the resolved config |
| metrics.jsonl | controller (jsonl sink), baseline parsers | one JSON object per training step: appended live as the run sees each step, rewritten whole at the end (every span counted in busy_s; cpu_s: the CPU seconds of each role's spans) |
| events.jsonl | controller (jsonl sink) | one JSON object per event (`event`: recovery, heartbeat_timeout, fault, scale; then its fields), appended as it happens |
| summary.json | controller | throughput, rewards, accounting, environment; busy and CPU seconds per step by role, the machine's busy cores |
| recovery.json | supervisor | faults, recoveries, DCS totals, scale operations |
| trace.json | controller | Chrome trace: one lane per role, a span per unit of work |
| status.json | controller | live state while the run goes on (progress, rewards, busy shares, recoveries, alerts), final at the end |
| host_load.json | whoever timed the run | the machine's load average before and after it |
| final_weights.safetensors | controller | the trained policy (`relax export`) |
| checkpoints/ | Actor | optimizer state (+ weights) every `health.checkpoint_every` steps |
| tensorboard/ | tensorboard sink | TensorBoard event files (`tensorboard --logdir RUN/tensorboard`) |
| wandb/ | wandb sink | the offline W&B run (`wandb/offline-run-*/run-*.wandb`; `wandb sync` uploads it) |
| mlruns/ | mlflow sink | MLflow file store (`mlflow ui --backend-store-uri RUN/mlruns`) |

Stdlib + PyYAML only, so the harness reads runs without importing torch or Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
RECOVERY = "recovery.json"
TRACE = "trace.json"
STATUS = "status.json"
HOST_LOAD = "host_load.json"
FINAL_WEIGHTS = "final_weights.safetensors"
CHECKPOINTS = "checkpoints"
SNAPSHOTS = "snapshots"  # weights of every task.eval_every-th version, v<N>.safetensors, for the eval curve
EVENTS = "events.jsonl"
# The metrics sinks' folders (relax/metrics/): each sink writes only inside its own.
SINK_DIRS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlruns"}
# Folders under a results root that hold no runs of their own.
NOT_EXPERIMENTS = frozenset({"published", "figures", "tables", "reference", "baselines"})


def _append_line(path: Path, record: dict) -> None:
    # One write() of a whole line on an O_APPEND file: a reader sees whole lines, or a last one cut short
    # (no newline yet, not valid JSON), which _read_lines skips.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def _read_lines(path: Path) -> list[dict]:
    text = path.read_text()
    lines = text.split("\n")
    rows = [json.loads(line) for line in lines[:-1] if line.strip()]
    if lines[-1].strip():  # not ended by a newline: a whole last row, or one a live run is writing now
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass
    return rows


def _write_atomic(path: Path, text: str) -> None:
    # A reader polling a live run (relax report, tests) never sees half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class RunFolder:
    """One run's folder. Writers replace whole files; readers return plain Python data."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def create(cls, out: str | Path, experiment: str, profile: str, run: str | None = None) -> RunFolder:
        """A new, empty folder `<out>/<experiment>/<profile>/<run>` (run: a timestamp and the PID); an existing
        one is an error, so two runs never write into one folder."""
        run = run or time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        path = Path(out) / experiment / profile / run
        path.mkdir(parents=True, exist_ok=False)
        return cls(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def experiment(self) -> str:
        return self.path.parent.parent.name

    @property
    def profile(self) -> str:
        return self.path.parent.name

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def complete(self) -> bool:
        """A finished run: the controller writes summary.json last. A run a role stopped (e.g.
        training.max_nonfinite_steps) writes one too, with its `error`: that one is `stopped`, not complete."""
        return _finished(self.path / SUMMARY)

    @property
    def stopped(self) -> bool:
        """The run was stopped before its last step; summary.json holds the error and the steps that ran."""
        return (self.path / SUMMARY).exists() and not self.complete

    # --- writers ----------------------------------------------------------------------------------------
    def write_config(self, text: str) -> None:
        _write_atomic(self.path / CONFIG, text)

    def write_metrics(self, rows: list[dict]) -> None:
        _write_atomic(self.path / METRICS, "".join(json.dumps(r) + "\n" for r in rows))

    def append_metrics(self, row: dict) -> None:
        """One step's row, while the run goes on (write_metrics replaces the file at the end)."""
        _append_line(self.path / METRICS, row)

    def append_event(self, event: dict) -> None:
        _append_line(self.path / EVENTS, event)

    def sink_dir(self, sink: str) -> Path:
        """The folder a metrics sink writes in (not created here: the sink makes it, and a failure is its own)."""
        return self.path / SINK_DIRS[sink]

    def snapshot_path(self, version: int) -> Path:
        """Where the weights of `version` are kept for the eval curve (task.eval_every; `snapshots` reads them)."""
        return self.path / SNAPSHOTS / f"v{version}.safetensors"

    def write_summary(self, summary: dict) -> None:
        _write_atomic(self.path / SUMMARY, json.dumps(summary, indent=2))

    def write_recovery(self, recovery: dict) -> None:
        _write_atomic(self.path / RECOVERY, json.dumps(recovery, indent=2, default=str))

    def write_trace(self, trace: dict) -> None:
        _write_atomic(self.path / TRACE, json.dumps(trace))

    def write_status(self, status: dict) -> None:
        _write_atomic(self.path / STATUS, json.dumps(status, default=str))

    def write_host_load(self, record: dict) -> None:
        _write_atomic(self.path / HOST_LOAD, json.dumps(record))

    # --- readers ----------------------------------------------------------------------------------------
    def snapshots(self) -> dict[int, Path]:
        """The kept weight snapshots, version -> file, in version order ({} when none)."""
        found = {int(p.stem[1:]): p for p in (self.path / SNAPSHOTS).glob("v*.safetensors")}
        return dict(sorted(found.items()))

    def config(self) -> dict:
        """The resolved config as a dict ({} when absent)."""
        path = self.path / CONFIG
        return yaml.safe_load(path.read_text()) or {} if path.exists() else {}

    def metrics(self) -> list[dict]:
        path = self.path / METRICS
        if not path.exists():
            raise FileNotFoundError(f"{self.path}: no {METRICS} (is this a run folder?)")
        return _read_lines(path)

    def events(self) -> list[dict]:
        """events.jsonl's events ([] when absent)."""
        path = self.path / EVENTS
        return _read_lines(path) if path.exists() else []

    def summary(self) -> dict:
        path = self.path / SUMMARY
        if not path.exists():
            raise FileNotFoundError(f"{self.path}: no {SUMMARY} (not a finished run)")
        return json.loads(path.read_text())

    def recovery(self) -> dict | None:
        path = self.path / RECOVERY
        return json.loads(path.read_text()) if path.exists() else None

    def status(self) -> dict | None:
        """The controller's live status (relax/metrics/status.py), None before it wrote one."""
        path = self.path / STATUS
        return json.loads(path.read_text()) if path.exists() else None

    def host_load(self) -> dict | None:
        path = self.path / HOST_LOAD
        return json.loads(path.read_text()) if path.exists() else None

    def trace_events(self) -> list[dict]:
        """trace.json's Chrome trace events ([] when absent)."""
        path = self.path / TRACE
        return json.loads(path.read_text())["traceEvents"] if path.exists() else []

    def spans(self) -> list[dict]:
        """Complete spans of trace.json: role (its lane's name), name, step, start, end (seconds since the run's
        first step started), args."""
        events = self.trace_events()
        lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
        return [{"role": lanes.get(e["tid"], str(e["tid"])), "name": e["name"], "step": e.get("args", {}).get("step"),
                 "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6, "args": e.get("args", {})}
                for e in events if e.get("ph") == "X"]


# --- finding runs ---------------------------------------------------------------------------------------
def run_dirs(root: str | Path, skip: frozenset[str] = NOT_EXPERIMENTS) -> list[Path]:
    """Every finished run at `<root>/<experiment>/<profile>/<run>/`, sorted, leaving out `skip` folders."""
    root = Path(root)
    return sorted(p.parent for p in root.glob(f"*/*/*/{SUMMARY}") if p.parts[len(root.parts)] not in skip
                  and _finished(p))


def _finished(summary: Path) -> bool:
    """summary.json exists and is not a stopped run's (which carries `error`)."""
    try:
        return "error" not in json.loads(summary.read_text())
    except FileNotFoundError:
        return False


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders named directly, or every finished run folder below the folders named."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / SUMMARY).exists():
            out.append(p)
        elif p.is_dir():
            found = sorted(q.parent for q in p.rglob(SUMMARY) if _finished(q))
            if not found:
                raise FileNotFoundError(f"{p}: no run folder (with {SUMMARY}) inside")
            out += found
        else:
            raise FileNotFoundError(f"{p}: not a run folder (no {SUMMARY})")
    return list(dict.fromkeys(out))


def latest_runs(root: str | Path, only: list[Path] | None = None) -> dict[tuple[str, str], Path]:
    """The newest finished run of each (experiment, profile) under root (among `only` when given)."""
    runs = run_dirs(root)
    if only is not None:
        keep = {Path(o).resolve() for o in only}
        runs = [r for r in runs if r.resolve() in keep]
    out: dict[tuple[str, str], Path] = {}
    for d in runs:
        key = (d.parent.parent.name, d.parent.name)
        if key not in out or d.name > out[key].name:
            out[key] = d
    return out


# --- provenance -----------------------------------------------------------------------------------------
@dataclass
class HostLoad:
    """The machine's load around a timed piece of work, so a number measured while other work shared the cores
    shows it. `with HostLoad() as h: ...` then `h.record`: loadavg_before/after (1, 5, 15 min), cpus, wall_s."""

    record: dict = field(default_factory=dict)

    def __enter__(self) -> HostLoad:
        self._t0 = time.time()
        self.record = {"loadavg_before": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
        return self

    def __exit__(self, *exc) -> None:
        self.record.update(loadavg_after=[round(x, 2) for x in os.getloadavg()],
                           wall_s=round(time.time() - self._t0, 1))


def format_host_load(record: dict | None) -> str | None:
    """'1.2 -> 3.4 on 2 cpus' (1-minute averages, before -> after), or None without a record."""
    if not record:
        return None
    return f"{record['loadavg_before'][0]:.1f} -> {record['loadavg_after'][0]:.1f} on {record['cpus']} cpus"


def git_commit(root: str | Path | None = None) -> str:
    """The short commit of the repository at root (this checkout by default), '?' outside a git checkout."""
    root = Path(root) if root else Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() or "?"
