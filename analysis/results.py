"""Run folders (read through relax/run_folder.py) as pandas tables for figures and reports.

Runs are classified into the systems the paper compares (relax colocate / async on-policy / async off-policy,
veRL, OpenRLHF) from their summary (`mode`, `max_staleness`, `schedule`), so any run can be put beside the
published numbers (analysis/published.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import published
from relax.run_folder import RunFolder, format_host_load, latest_runs, run_dirs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
REFERENCE = RESULTS / "reference"
PUBLISHED_HW = "16xH800 (published)"


@dataclass(frozen=True)
class System:
    key: str
    label: str
    color: str
    emulated: bool
    experiment: str  # the CPU-scale run of this system: results/<experiment>/<profile>/
    profile: str
    # (experiment, system, mode) of its row in the published table, None when the paper has none
    published: tuple[str, str, str] | None


SYSTEMS = {s.key: s for s in [
    System("colocate", "relax colocate", "#7f7f7f", False, "colocate", "cpu", ("text_modes", "relax", "colocate")),
    System("async_on_policy", "relax async on-policy", "#1f77b4", False, "async", "cpu-onpolicy",
           ("text_modes", "relax", "async_on_policy")),
    System("async_off_policy", "relax async off-policy", "#d62728", False, "async", "cpu",
           ("text_modes", "relax", "async_off_policy")),
    System("verl", "veRL (emulated)", "#2ca02c", True, "async", "cpu-verl", ("vs_verl", "verl", "async")),
    System("openrlhf", "OpenRLHF (emulated)", "#9467bd", True, "async", "cpu-openrlhf", None),
]}


def system_of(summary: dict) -> str:
    """The system a run belongs to, from its summary."""
    schedule = summary.get("schedule", "relax")
    if schedule != "relax":
        return schedule
    if summary.get("mode") == "colocate":
        return "colocate"
    return "async_on_policy" if summary.get("max_staleness", 1) == 0 else "async_off_policy"


def system_runs(root: Path, only: list[Path] | None = None) -> dict[str, Path]:
    """The newest run of each compared system (by its experiment/profile), in SYSTEMS order."""
    runs = latest_runs(root, only)
    return {k: runs[(s.experiment, s.profile)] for k, s in SYSTEMS.items() if (s.experiment, s.profile) in runs}


def staleness_runs(root: Path, only: list[Path] | None = None) -> dict[int, Path]:
    """The newest relax async run of the `async` experiment for each max_staleness (the staleness sweep)."""
    out: dict[int, Path] = {}
    keep = None if only is None else {Path(o).resolve() for o in only}
    for d in run_dirs(root):
        if keep is not None and d.resolve() not in keep:
            continue
        if d.parent.parent.name != "async":
            continue
        s = load_summary(d)
        if s.get("mode") != "async" or s.get("schedule", "relax") != "relax":
            continue
        k = int(s["max_staleness"])
        if k not in out or d.name > out[k].name:
            out[k] = d
    return dict(sorted(out.items()))


def load_summary(run: Path) -> dict:
    return RunFolder(run).summary()


def load_config(run: Path) -> dict:
    return RunFolder(run).config()


def load_metrics(run: Path) -> pd.DataFrame:
    # per-role dicts (busy_s, busy_share) become busy_s/<role> columns, as the metrics sinks name them
    return pd.json_normalize(RunFolder(run).metrics(), sep="/")


def load_trace(run: Path) -> pd.DataFrame:
    """Spans of trace.json: role, name, step, start, end (seconds since the run's first step started)."""
    return pd.DataFrame(RunFolder(run).spans(), columns=["role", "name", "step", "start", "end"])


def host_load(run: Path) -> str | None:
    """The machine's 1-minute load average before -> after the run (written by whoever timed it), so a
    number measured while other work shared the cores shows it."""
    return format_host_load(RunFolder(run).host_load())


def hardware(summary: dict, config: dict | None = None) -> str:
    """What a run was measured on: the machine and the model."""
    hw = summary.get("environment", {}).get("hardware", "unknown hardware")
    m = (config or {}).get("model", {})
    if m.get("kind") in ("tiny_qwen3", "tiny_qwen3_moe"):
        model = f"{m['kind']} h{m.get('hidden_size')} x{m.get('num_layers')}L"
    else:
        model = m.get("kind", "model")
    return f"{hw}, {model}"


def run_kind(summary: dict) -> tuple[str, dict]:
    """How a run's numbers came about, and the summary part whose step times to show: an emulated-GPU run's are
    the emulated hardware's seconds (its top-level ones are this machine's real seconds)."""
    if summary.get("simulated"):
        where = summary.get("environment", {}).get("hardware", "").removeprefix("simulated: ")
        return f"SIMULATED ({where})" if where else "SIMULATED", summary
    emu = summary.get("emulated_hardware")
    if emu:
        return f"EMULATED {emu['hardware']} ({emu['compression']:g}x compression)", emu
    return "measured", summary


def published_metric(key: str, metric: str, against: str | None = None) -> float | None:
    """A system's published `metric`. Relax async compared with veRL uses the paper's vs-veRL run."""
    sys = SYSTEMS[key]
    if sys.published is None:
        return None
    if key == "async_off_policy" and against == "verl":
        return published.value("vs_verl", "relax", "async", metric)
    return published.value(*sys.published, metric)
