"""Table and figure of the emulated-GPU study (`relax study emulate`, experiments/emulate/study.py), from
`<results>/emulate/emulate_results.json`: each configuration's step time on the REAL engine with EMULATED GPUs,
the simulator's prediction for the same config and cost model, and the published number (analysis/published.py).
Where emulated exceeds simulated, the trainer's critical path (trace.json, in emulated seconds) says where."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis.plot import save  # noqa: E402
from analysis.published import value as published_value  # noqa: E402
from analysis.tables import write_table  # noqa: E402

RESULTS_FILE = "emulate_results.json"
TAG = "EMULATED"


def _published(row: dict) -> float | None:
    key = row.get("published")
    return published_value(*key) if key else None


def _critical_path(root: Path, row: dict, compression: float) -> dict:
    """The trainer's critical path of the emulated run, mean per step past the first, in emulated seconds."""
    from analysis.critical_path import step_breakdowns

    try:
        table = step_breakdowns(root / row["emulated"]["run_dir"])
    except (FileNotFoundError, KeyError, ValueError):
        return {}
    steady = table[table["step"] > 0] if "step" in table and len(table) > 1 else table
    cols = [c for c in steady.columns if c not in ("step", "step_time_s")]
    return {c: round(float(steady[c].mean()) * compression, 1) for c in cols if float(steady[c].mean()) > 0}


def rows(res: dict, root: Path) -> list[dict]:
    out = []
    for r in [*res["runs"], *([res["beyond"]] if res.get("beyond") else [])]:
        em, si = r["emulated"], r["simulated"]
        cp = _critical_path(root, r, res["compression"])
        on_host = r.get("emulated_over_simulated_on_host")
        out.append({"configuration": r["name"], "emulated_s": round(em["mean_step_time_s"], 1),
                    "simulated_s": round(si["mean_step_time_s"], 1),
                    "emulated/simulated": round(r["emulated_over_simulated"], 3),
                    "within_10%": abs(r["emulated_over_simulated"] - 1) <= 0.10,
                    # the twin with this host's work (relax.sim.hardware.on_host): what the emulated run should take
                    "simulated_on_host_s": round(r["simulated_on_host"]["mean_step_time_s"], 1) if on_host else None,
                    "emulated/simulated_on_host": round(on_host, 3) if on_host else None,
                    "within_10%_on_host": None if on_host is None else abs(on_host - 1) <= 0.10,
                    "published_s": _published(r),
                    "trainer_wait_share_emulated": em["trainer_wait_share"],
                    "trainer_wait_share_simulated": si["trainer_wait_share"],
                    "real_s_per_step": em["real_mean_step_time_s"],
                    "lost/dup": f"{em['samples_lost']}/{em['samples_duplicated']}",
                    "host_load": f"{em['load_before']} -> {em['load_after']}",
                    # each lane's busy seconds per step, emulated / simulated: where the extra time goes
                    "busy_emulated/simulated_s": ", ".join(
                        f"{n} {em['busy_per_step_s'][n]:.0f}/{si['busy_per_step_s'].get(n, 0):.0f}"
                        for n in em.get("busy_per_step_s", {}) if n in si.get("busy_per_step_s", {})),
                    "critical_path_emulated_s": ", ".join(f"{k} {v}" for k, v in cp.items()),
                    # the simulator's critical path is summed over its steps: per step here
                    "critical_path_simulated_s": ", ".join(f"{k} {round(v / r.get('steps', res['steps']), 1)}"
                                                           for k, v in si["critical_path_s"].items())})
    return out


def plot(table: list[dict], res: dict, path: Path) -> Path:
    names = [r["configuration"] for r in table]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(9, 4))
    bars = [("emulated_s", f"emulated ({res['hardware']}, real engine)"),
            ("simulated_s", "simulated (same cost model)"),
            ("simulated_on_host_s", "simulated, this host's CPU work x compression"),
            ("published_s", "published (arXiv 2604.11554)")]
    bars = [b for b in bars if any(r[b[0]] for r in table)]
    w = 0.8 / len(bars)
    for j, (key, label) in enumerate(bars):
        ax.bar([i + (j - (len(bars) - 1) / 2) * w for i in x], [r[key] or 0 for r in table], w, label=label)
    ax.set_xticks(list(x), names, rotation=15)
    ax.set_ylabel("step time (s, hardware seconds)")
    ax.set_title(f"{TAG} {res['hardware']} GPUs at {res['compression']:g}x compression vs SIMULATED vs published")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return path


def _beyond_table(res: dict, tables_dir: Path) -> list[Path]:
    """Beyond-the-paper against its gated base and against the limits relax/sim/bound.py sets."""
    b = res.get("beyond")
    if not b or "share_of_floor_emulated" not in b:
        return []
    lim = b["simulated_steady"]["bound"]
    steps = b.get("steps", res["steps"])
    runs = [(b, "emulated", f"EMULATED, {steps} steps, mean past the first"),
            (b, "simulated", f"SIMULATED, {steps} steps, mean past the first"),
            (b, "simulated_steady", f"SIMULATED, {b['simulated_steady']['steps']} steps, steady state (past the "
                                    "first max_staleness + 1)")]
    ab = b.get("ablation")
    if ab:  # the same run less one feature, e.g. streaming alone without partial rollout
        less = ", ".join(f"rollout.{k}={v}" for k, v in ab["ablation"].items())
        runs += [(ab, kind, f"{kind.upper()}, {steps} steps, with {less}") for kind in ("emulated", "simulated")]
    table = [{"run": label, "step_s": round(r[kind]["mean_step_time_s"], 1),
              "speed-up vs gated (x)": r.get(f"speedup_vs_gated_{kind}"),
              "share of the slowest pool's bound": r[f"share_of_bound_{kind}"],
              "share of the bound with the latency floor": r[f"share_of_floor_{kind}"],
              "share of the batch-latency trade-off": r.get(f"share_of_tradeoff_{kind}")} for r, kind, label in runs]
    split = b.get("split") or {}
    ran = b.get("rollout") or {}
    note = (f"{TAG} / SIMULATED: {b['name']} ({', '.join(b['overrides'])}; split {split.get('rollout_gpus')} rollout : "
            f"{split.get('actor_gpus')} actor GPUs, so {ran.get('replicas')} replicas, chunk_groups "
            f"{ran.get('chunk_groups')}, max_inflight {ran.get('max_inflight')}) against {b['base']}. Bound: the "
            "slowest pool's work "
            f"({lim['slowest_pool']}, {lim['bound_step_s']} s a step). Latency floor: (longest response decoded alone "
            f"{lim['longest_response_alone_s']} s + the Actor's {lim['limits_s']['actor']} s) / (max_staleness + 1) = "
            f"{lim['latency_floor_s']} s; the bound with it {lim['floor_step_s']} s (relax/sim/bound.py, the steady "
            "run's limits). Batch-latency trade-off (an estimate, not a bound): the best step when every engine runs "
            f"one batch size, the tail decoding in it ({lim.get('tradeoff_step_s')} s at a batch of "
            f"{lim.get('tradeoff_batch')}). A few steps' mean past the first favours a rollout that runs ahead (the "
            "gate admits partitions 0..s at once): the steady row is the one to read against the bound.")
    return write_table(table, tables_dir, "emulate_beyond", f"{TAG}: beyond the paper against the bound", note,
                       columns=list(table[0]))


def draw_emulate(results_root, figures_dir, tables_dir) -> list[Path]:
    root = Path(results_root) / "emulate"
    f = root / RESULTS_FILE
    if not f.exists():
        return []
    res = json.loads(f.read_text())
    table = rows(res, root)
    if not table:
        return []
    Path(figures_dir).mkdir(parents=True, exist_ok=True)
    beyond_steps = f"beyond-the-paper {res['beyond'].get('steps', res['steps'])}" if res.get("beyond") else "each"
    note = (f"{TAG}: the real engine (processes, bus, DCS, supervisor) with each unit of GPU work taking the relax/sim "
            f"cost model's time on '{res['hardware']}', compressed {res['compression']:g}x; times in emulated hardware "
            f"seconds (real x compression); {res['steps']} steps per run ({beyond_steps}), mean past the first. "
            "Tokens synthetic, lengths from the sim's length model (same draw as the simulated column). CPU work (bus, "
            "Ray calls, reward) runs at this machine's real speed, so it weighs compression times more than on a "
            "cluster. "
            "Simulated: relax/sim on the same config (engine as built), on the target's hardware (a cluster's step). "
            "Simulated on host: the same, with the host work (Ray calls, bus, reward) at this machine's cost measured "
            "at the study's start (relax.sim.measure.host_overheads) times the compression, as the emulated run meets "
            "it (relax.sim.hardware.on_host): what the engine's schedule should take here. Published: "
            "analysis/published.py.")
    written = write_table(table, Path(tables_dir), "emulate_vs_sim", f"{TAG}: step time, emulated vs simulated vs "
                          "published", note, columns=list(table[0]))
    written = [*written, plot(table, res, Path(figures_dir) / "emulate_vs_sim.png")]
    written += _beyond_table(res, Path(tables_dir))
    f = res.get("faults")
    if f and f["events"]:
        em = f["emulated"]
        fnote = (f"{TAG} {res['hardware']}: async off-policy at the paper's shape with {f['overrides'][0]}. Recovery = "
                 "the real seconds of our processes (fault to replacement ready, not compressed) + the modelled GPU "
                 "reload (relax.emulate.Emulator.reload_time: weights over the link from a DCS peer; the Actor also its "
                 f"optimizer state over the host link). Run: samples lost {em['samples_lost']}, duplicated "
                 f"{em['samples_duplicated']}; host load {em['load_before']} -> {em['load_after']}.")
        written += write_table(f["events"], Path(tables_dir), "emulate_faults", f"{TAG}: recovery at the paper's shape",
                               fnote, columns=list(f["events"][0]))
    return written
