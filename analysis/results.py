"""Reading run folders (DESIGN.md section 7) into pandas tables for figures and reports.

A run folder holds config.yaml, metrics.jsonl, trace.json and summary.json. Runs are classified into the
systems the paper compares (relax colocate / async on-policy / async off-policy, veRL, OpenRLHF) from their
summary (`mode`, `max_staleness`, `schedule`), so any run can be put beside the published numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PUBLISHED = RESULTS / "published" / "relax_paper.csv"
REFERENCE = RESULTS / "reference"
SKIP = {"published", "figures", "tables", "reference", "baselines"}
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


def run_dirs(root: Path, only: list[Path] | None = None) -> list[Path]:
    """Every complete run (has summary.json) at results/<experiment>/<profile>/<run>/ under root (restricted
    to the folders in `only` when given)."""
    root = Path(root)
    runs = sorted(p.parent for p in root.glob("*/*/*/summary.json") if p.parts[len(root.parts)] not in SKIP)
    if only is not None:
        keep = {Path(o).resolve() for o in only}
        runs = [r for r in runs if r.resolve() in keep]
    return runs


def find_runs(paths: list[Path | str]) -> list[Path]:
    """Run folders named directly, or every run folder below the folders named (for `relax report`)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "summary.json").exists():
            out.append(p)
        elif p.is_dir():
            found = sorted(q.parent for q in p.rglob("summary.json"))
            if not found:
                raise FileNotFoundError(f"{p}: no run folder (with summary.json) inside")
            out += found
        else:
            raise FileNotFoundError(f"{p}: not a run folder (no summary.json)")
    return list(dict.fromkeys(out))


def latest_runs(root: Path, only: list[Path] | None = None) -> dict[tuple[str, str], Path]:
    """The newest run of each (experiment, profile)."""
    out: dict[tuple[str, str], Path] = {}
    for d in run_dirs(root, only):
        key = (d.parent.parent.name, d.parent.name)
        if key not in out or d.name > out[key].name:
            out[key] = d
    return out


def system_runs(root: Path, only: list[Path] | None = None) -> dict[str, Path]:
    """The newest run of each compared system (by its experiment/profile), in SYSTEMS order."""
    runs = latest_runs(root, only)
    return {k: runs[(s.experiment, s.profile)] for k, s in SYSTEMS.items() if (s.experiment, s.profile) in runs}


def staleness_runs(root: Path, only: list[Path] | None = None) -> dict[int, Path]:
    """The newest relax async run of the `async` experiment for each max_staleness (the staleness sweep)."""
    out: dict[int, Path] = {}
    for d in run_dirs(root, only):
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
    return json.loads((Path(run) / "summary.json").read_text())


def load_config(run: Path) -> dict:
    path = Path(run) / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def load_metrics(run: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    df = pd.json_normalize(rows)
    df.columns = [c.replace("busy_s.", "busy_s/") for c in df.columns]
    return df


def load_trace(run: Path) -> pd.DataFrame:
    """Spans of trace.json: role, name, step, start, end (seconds since the run's first step started)."""
    path = Path(run) / "trace.json"
    if not path.exists():
        return pd.DataFrame(columns=["role", "name", "step", "start", "end"])
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows = [{"role": lanes.get(e["tid"], str(e["tid"])), "name": e["name"], "step": e.get("args", {}).get("step"),
             "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6}
            for e in events if e.get("ph") == "X"]
    return pd.DataFrame(rows, columns=["role", "name", "step", "start", "end"])


def host_load(run: Path) -> str | None:
    """The machine's 1-minute load average before -> after the run (written by analysis.reproduce), so a
    number measured while other work shared the cores shows it."""
    path = Path(run) / "host_load.json"
    if not path.exists():
        return None
    h = json.loads(path.read_text())
    return f"{h['loadavg_before'][0]:.1f} -> {h['loadavg_after'][0]:.1f} on {h['cpus']} cpus"


def hardware(summary: dict, config: dict | None = None) -> str:
    """What a run was measured on: the machine and the model."""
    hw = summary.get("environment", {}).get("hardware", "unknown hardware")
    m = (config or {}).get("model", {})
    if m.get("kind") in ("tiny_qwen3", "tiny_qwen3_moe"):
        model = f"{m['kind']} h{m.get('hidden_size')} x{m.get('num_layers')}L"
    else:
        model = m.get("kind", "model")
    return f"{hw}, {model}"


def published() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED)


def published_value(experiment: str, system: str, mode: str, metric: str) -> float | None:
    df = published()
    hit = df[(df.experiment == experiment) & (df.system == system) & (df["mode"] == mode) & (df.metric == metric)]
    return float(hit.value.iloc[0]) if len(hit) else None


def published_metric(key: str, metric: str, against: str | None = None) -> float | None:
    """A system's published `metric`. Relax async compared with veRL uses the paper's vs-veRL run."""
    sys = SYSTEMS[key]
    if sys.published is None:
        return None
    if key == "async_off_policy" and against == "verl":
        return published_value("vs_verl", "relax", "async", metric)
    return published_value(*sys.published, metric)
