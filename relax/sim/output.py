"""A simulation's results in our run-folder schema (DESIGN.md section 7; relax/run_folder.py): metrics.jsonl,
summary.json, trace.json and config.yaml, every file flagged `"simulated": true` and naming the hardware."""

from __future__ import annotations

import bisect
from collections import defaultdict

from relax.config import ExperimentConfig, dump_config
from relax.metrics.telemetry import union_seconds
from relax.run_folder import RunFolder
from relax.schedules.spans import CATEGORY, IDLE, OTHER, TRAINER_LANE, WAIT_SPANS
from relax.sim.sim import Simulation

ROLES = ("rollout", "reward", "reference", "actor_fwd", "advantages", "actor")


def roles_of(sim: Simulation) -> list[str]:
    return sorted({s.role for s in sim.spans} | {"rollout", "actor"}, key=lambda r: ROLES.index(r)
                  if r in ROLES else len(ROLES))


def metrics_rows(sim: Simulation, hardware: str) -> list[dict]:
    ends = [sim.step_end[k] for k in range(sim.steps)]
    starts = [0.0] + ends[:-1]
    roles = roles_of(sim)
    # Busy seconds per role per step window, as the controller counts them: the union of the role's spans.
    pieces: dict[tuple[int, str], list] = defaultdict(list)
    for s in sim.spans:
        i = bisect.bisect_right(ends, s.start)
        while i < len(ends) and starts[i] < s.end:
            pieces[(i, s.role)].append((max(s.start, starts[i]), min(s.end, ends[i])))
            i += 1
    rows = []
    for k in range(sim.steps):
        versions = sim.group_version[k]
        stale = [k - v for v in versions]
        extra = sim.step_extra.get(k, {})
        resp = [x for g in sim.resp[k] for x in g]
        rows.append({"step": k, "wall_time_s": round(ends[k], 4), "step_time_s": round(ends[k] - starts[k], 4),
                     "train_time_s": round(extra.get("train_time_s", 0.0), 4), "samples": sim.P * sim.G,
                     "tokens": int(sum(resp)), "staleness_mean": sum(stale) / len(stale),
                     "staleness_max": max(stale), "trainer_wait_s": round(extra.get("trainer_wait_s", 0.0), 4),
                     "weight_sync_s": round(extra.get("weight_sync_s", 0.0), 4), "weight_version": k + 1,
                     "busy_s": {r: round(union_seconds(pieces.get((k, r), [])), 4) for r in roles},
                     **({"sleep_wake_s": round(extra["sleep_wake_s"], 4)} if "sleep_wake_s" in extra else {}),
                     "simulated": True, "hardware": hardware})
    return rows


def critical_path(sim: Simulation) -> dict[str, float]:
    """Seconds of the trainer lane by what the trainer was doing (relax/schedules/spans.py categories); time no
    trainer span covers is the trainer idle, waiting for data."""
    total = sim.step_end[sim.steps - 1]
    out: dict[str, float] = defaultdict(float)
    covered = []
    for s in sim.spans:
        if s.role == TRAINER_LANE:
            out[CATEGORY.get(s.name, OTHER)] += s.end - s.start
            covered.append((s.start, s.end))
    out[IDLE] += max(total - union_seconds(covered), 0.0)
    return {c: round(v, 4) for c, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def utilisation(sim: Simulation) -> dict[str, float]:
    """Share of the run each role's devices spent working (waits excluded; rollout: mean over replicas)."""
    total = sim.step_end[sim.steps - 1]
    work: dict[str, list] = defaultdict(list)
    for s in sim.spans:
        if s.name not in WAIT_SPANS:
            work[(s.role, s.args.get("replica", 0))].append((s.start, s.end))
    per_role: dict[str, list[float]] = defaultdict(list)
    for (role, _), iv in work.items():
        per_role[role].append(union_seconds(iv) / total)
    reps = sim.cfg.rollout.replicas
    return {r: round(sum(v) / (reps if r == "rollout" else len(v)), 4) for r, v in per_role.items()}


def _mean_past(sim: Simulation, skip: int) -> float:
    """Mean step time of the steps after the first `skip` (1 step run: its own time)."""
    ends = [sim.step_end[k] for k in range(sim.steps)]
    if len(ends) == 1:
        return ends[0]
    return (ends[-1] - ends[skip - 1]) / (len(ends) - skip)


def mean_step_time(sim: Simulation) -> float:
    """Mean step time past the first step (the pipeline's fill), as summarize() counts it; needs no spans."""
    return _mean_past(sim, 1)


def steady_step_time(sim: Simulation) -> float:
    """Mean step time past the first max_staleness + 1 steps: the gate admits partitions 0..s at once, so in a
    short run the rollout's head start on them makes the later steps look faster than the steady state (a
    10-step run at s = 2 read 271 s a step where 40 steps read 306 s). For comparisons with a bound."""
    skip = min(sim.cfg.max_staleness + 1, sim.steps - 1) if sim.cfg.mode == "async" else 1
    return _mean_past(sim, skip)


def summarize(sim: Simulation, rows: list[dict], hardware: str, devices: str) -> dict:
    cfg, cost = sim.cfg, sim.cost
    train_s = rows[-1]["wall_time_s"]
    steady = rows[1:] or rows
    step_time = sum(r["step_time_s"] for r in steady) / len(steady)
    roles = roles_of(sim)
    busy_per_step = {n: sum(r["busy_s"][n] for r in steady) / len(steady) for n in roles}
    return {
        "experiment": cfg.name, "profile": cfg.profile, "mode": cfg.mode, "max_staleness": cfg.max_staleness,
        "schedule": cfg.schedule, "emulated": cfg.schedule != "relax", "simulated": True, "hardware": hardware,
        "steps": len(rows), "train_time_s": round(train_s, 3),
        "steps_per_hour": round(3600 * len(rows) / train_s, 3),
        "tokens_per_s": round(sum(r["tokens"] for r in rows) / train_s, 3),
        "samples_per_s": round(sum(r["samples"] for r in rows) / train_s, 3),
        "mean_step_time_s": round(step_time, 4),
        "steady_step_time_s": round(steady_step_time(sim), 4),  # past the first s + 1 (for a bound; run 30+ steps)
        "staleness_max": max(r["staleness_max"] for r in rows),
        "trainer_wait_share": round(sum(r["trainer_wait_s"] for r in steady) /
                                    sum(r["step_time_s"] for r in steady), 4),
        "busy_per_step_s": {n: round(v, 4) for n, v in busy_per_step.items()},
        "pipeline_efficiency": round(max(busy_per_step.values()) / step_time, 4),
        "utilisation": utilisation(sim),
        "critical_path_s": critical_path(sim),
        "response_tokens_mean": round(sum(r["tokens"] for r in rows) / sum(r["samples"] for r in rows), 2),
        "lengths": sim.lengths.source,
        "implied": cost.implied(),
        "assumed": cost.hw.assumptions(),
        "samples_trained": len(rows) * sim.P * sim.G, "samples_lost": 0, "samples_duplicated": 0,
        **({"sleep_wake_s_mean": round(sum(r.get("sleep_wake_s", 0.0) for r in rows) / len(rows), 4)}
           if cfg.mode == "colocate" else {}),
        "environment": {"hardware": f"simulated: {devices}", "simulated": True, "profile_measured": cost.hw.measured},
    }


def chrome_trace(sim: Simulation, hardware: str) -> dict:
    lanes: dict[tuple[str, int], int] = {}
    for s in sim.spans:
        lanes.setdefault((s.role, s.args.get("replica", 0)), 0)
    ordered = sorted(lanes, key=lambda x: (ROLES.index(x[0]) if x[0] in ROLES else 99, x[1]))
    tid = {key: i for i, key in enumerate(ordered)}
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[key], "args": {"name": key[0]}}
              for key in ordered]
    for s in sim.spans:
        events.append({"name": s.name, "ph": "X", "pid": 1, "tid": tid[(s.role, s.args.get("replica", 0))],
                       "ts": round(s.start * 1e6), "dur": round((s.end - s.start) * 1e6),
                       "args": {"step": s.step, **s.args}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "simulated": True, "hardware": hardware}


def write_run(sim: Simulation, cfg: ExperimentConfig, out: str, hardware: str, devices: str,
              run: str | None = None) -> tuple[RunFolder, dict]:
    rows = metrics_rows(sim, hardware)
    summary = summarize(sim, rows, hardware, devices)
    folder = RunFolder.create(out, cfg.name, f"{cfg.profile}-sim-{hardware}", run)
    folder.write_config(f"# simulated: true (relax simulate, hardware {hardware})\n" + dump_config(cfg))
    folder.write_metrics(rows)
    folder.write_trace(chrome_trace(sim, hardware))
    folder.write_summary(summary)
    return folder, summary
