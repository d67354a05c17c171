"""The emulated-GPU study (issue 15 item 4): the paper's configurations on the REAL engine with EMULATED H800s.

`relax study emulate [--spec experiments/emulate/variants.yaml] [--out results] [--only NAME ...] [--steps N]`

For each run of the spec (colocate, async on-policy, async off-policy, the veRL and OpenRLHF schedules): one
`relax run CONFIG --emulate HARDWARE` (relax/emulate/: processes, bus, DCS, supervisor as they are; each unit
of GPU work takes the cost model's time over the compression) and the simulator's prediction for the same config
(relax/sim, the same cost model and response-length draw, the engine as built) twice: on the target hardware (a
cluster) and on its host twin (the target with this machine's host work, measured first, at the compression: what
the emulated run should take here). Beyond the paper: request-level streaming + partial rollout + the rollout:actor
split the simulator finds best for that engine, against the paper's gated configuration, with the slowest pool's
bound (relax/sim/bound.py), and beside it the spec's ablation (streaming alone).

Writes `<out>/emulate/emulate_results.json` (and the run folders under `<out>/emulate/runs/`); analysis/emulate.py
draws the table and figure beside the published numbers. Every number is EMULATED or SIMULATED, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import yaml

from experiments.sim.study import groups_per_replica
from relax.config import ExperimentConfig, load_config, validate

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(__file__).resolve().parent / "variants.yaml"
RESULTS_FILE = "emulate_results.json"
STEADY_STEPS = 30  # the simulator's long run for beyond-the-paper's share of its bound (steady state)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default=str(SPEC), help="the study's YAML (default: experiments/emulate/variants.yaml)")
    p.add_argument("--out", default=str(ROOT / "results"), help="results root; writes <out>/emulate/")
    p.add_argument("--only", nargs="+", help="run only these names (and 'beyond')")
    p.add_argument("--steps", type=int, help="steps per run (default: the spec's)")
    p.add_argument("--compression", type=float, help="emulated seconds per real second (default: the spec's); "
                   "two studies at different values separate this machine's own overhead (it grows with it)")


def simulate(cfg: ExperimentConfig, spec: dict, stream: bool = False, inflight: int | None = None,
             hardware=None) -> dict:
    """The simulator's prediction for `cfg` (the engine's behaviour: stream / inflight groups as it runs them) on
    the spec's hardware, or on `hardware` (a profile: the emulation's host twin)."""
    from relax.sim import build, devices_label
    from relax.sim.bound import pool_limits
    from relax.sim.output import metrics_rows, summarize

    sim = build(cfg, hardware or spec["hardware"], band=spec.get("band", "mid"), stream_groups=stream,
                inflight_groups=inflight).run()
    s = summarize(sim, metrics_rows(sim, sim.cost.hw.name), sim.cost.hw.name, devices_label(cfg, sim.cost.hw))
    return {"simulated": True, "mean_step_time_s": s["mean_step_time_s"], "steps_per_hour": s["steps_per_hour"],
            "trainer_wait_share": s["trainer_wait_share"], "critical_path_s": s["critical_path_s"],
            "busy_per_step_s": s["busy_per_step_s"], "tokens_per_s": s["tokens_per_s"],
            "bound": pool_limits(sim, range(1, sim.steps) if sim.steps > 1 else None)}  # the steps the mean counts


def emulate(cfg: ExperimentConfig, spec: dict, out: Path, name: str) -> dict:
    """One emulated run; its summary's emulated-hardware numbers, the real ones beside, and the host load."""
    from relax.controller import run_experiment

    cfg = cfg.model_copy(update={"emulate": cfg.emulate.model_copy(update={
        "hardware": spec["hardware"], "compression": float(spec["compression"]), "band": spec.get("band", "mid")})})
    load0, t0 = os.getloadavg()[0], time.time()
    run_dir, s = run_experiment(cfg, out=out / "runs", run=name, progress=False)
    e, c = s["emulated_hardware"], s["emulated_hardware"]["compression"]
    return {"emulated": True, "run_dir": str(run_dir.relative_to(out)), "mean_step_time_s": e["mean_step_time_s"],
            "steps_per_hour": e["steps_per_hour"], "tokens_per_s": e["tokens_per_s"],
            "trainer_wait_share": s["trainer_wait_share"],
            "busy_per_step_s": {n: round(v * c, 3) for n, v in s["busy_per_step_s"].items()},
            "real_mean_step_time_s": s["mean_step_time_s"], "actor_work": e["actor_work"],
            "samples_lost": s["samples_lost"], "samples_duplicated": s["samples_duplicated"],
            "staleness_max": s["staleness_max"], "wall_s": round(time.time() - t0, 1),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}


def one(name: str, cfg: ExperimentConfig, spec: dict, out: Path, sim_opts: dict, extra: dict) -> dict:
    """One emulated run beside two simulations of it: on the target (a cluster's step) and on the host twin (the
    target's GPUs with this machine's host work, as the emulated run meets them: what it should take)."""
    print(f"[emulate] {name}: simulating, then the emulated run ({spec['compression']}x)", flush=True)
    row = {"name": name, **extra, "simulated": simulate(cfg, spec, **sim_opts),
           "simulated_on_host": simulate(cfg, spec, **sim_opts, hardware=spec["host_twin"]),
           "emulated": emulate(cfg, spec, out, name)}
    em, si = row["emulated"]["mean_step_time_s"], row["simulated"]["mean_step_time_s"]
    sh = row["simulated_on_host"]["mean_step_time_s"]
    row["emulated_over_simulated"] = round(em / si, 4)
    row["emulated_over_simulated_on_host"] = round(em / sh, 4)
    print(f"    emulated {em:.1f} s/step, simulated {si:.1f} s/step ({em / si:.2f}x), on this host {sh:.1f} s/step "
          f"({em / sh:.2f}x); trainer wait share {row['emulated']['trainer_wait_share']:.3f}; "
          f"{row['emulated']['wall_s']:.0f} s real", flush=True)
    return row


def host_twin(spec: dict, cfg: ExperimentConfig) -> tuple[dict, object]:
    """This machine's host work (relax profile's Ray, bus and reward timings, on the stand-in config an emulated
    run of `cfg` runs) and the spec's hardware with it at the spec's compression (relax.sim.hardware.on_host)."""
    from relax.emulate import engine_config
    from relax.sim.hardware import load_hardware, on_host
    from relax.sim.measure import host_overheads

    stand_in = engine_config(cfg.model_copy(update={"emulate": cfg.emulate.model_copy(update={
        "hardware": spec["hardware"], "compression": float(spec["compression"])})}))
    load0, t0 = os.getloadavg()[0], time.time()
    host = host_overheads(stand_in)
    measured = {"overheads": host, "wall_s": round(time.time() - t0, 1), "load_before": round(load0, 2),
                "load_after": round(os.getloadavg()[0], 2)}
    print(f"[emulate] host work measured in {measured['wall_s']} s: "
          + ", ".join(f"{k} {v['value']:.3g}" for k, v in host.items()), flush=True)
    return measured, on_host(load_hardware(spec["hardware"]), host, float(spec["compression"]))


def main(args: argparse.Namespace) -> int:
    spec = yaml.safe_load(Path(args.spec).read_text())
    if args.steps:  # every run's, the sections' own included
        spec["steps"] = args.steps
        for section in ("beyond", "faults"):
            (spec.get(section) or {}).pop("steps", None)
    if args.compression:
        spec["compression"] = args.compression
    out = Path(args.out) / "emulate"
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    results = {"emulated": True, "hardware": spec["hardware"], "compression": spec["compression"],
               "steps": spec["steps"], "band": spec.get("band", "mid"), "runs": [], "beyond": None}
    configs = {}
    for r in spec["runs"]:
        configs[r["name"]] = (r, load_config(ROOT / r["config"], [*r["overrides"], f"steps={spec['steps']}"]))
    if not args.only or set(args.only) - {"faults"}:  # the faults run is not set beside a simulation
        results["host"], spec["host_twin"] = host_twin(spec, next(iter(configs.values()))[1])
    for r, cfg in configs.values():
        if args.only and r["name"] not in args.only:
            continue
        results["runs"].append(one(r["name"], cfg, spec, out, {}, {
            "config": r["config"], "overrides": r["overrides"], "published": r.get("published")}))
    b = spec.get("beyond")
    if b and (not args.only or "beyond" in args.only):
        results["beyond"] = beyond(b, configs, spec, out, results)
    f = spec.get("faults")
    if f and (not args.only or "faults" in args.only):
        results["faults"] = faults(f, configs, spec, out)
    results["wall_s"] = round(time.time() - t_all, 1)
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2))
    print(f"EMULATED ({spec['hardware']}) results: {out / RESULTS_FILE} ({results['wall_s']:.0f} s)")
    return 0


def faults(f: dict, configs: dict, spec: dict, out: Path) -> dict:
    """An emulated run with the spec's kills; each recovery as real seconds (detect, ready: our processes) plus the
    modelled GPU reload of the role (relax.emulate.Emulator.reload_time)."""
    from relax.emulate import Emulator, engine_config

    r, _ = configs[f["base"]]
    cfg = load_config(ROOT / r["config"], [*r["overrides"], *f["overrides"], f"steps={f.get('steps', spec['steps'])}"])
    print(f"[emulate] faults: {cfg.faults}", flush=True)
    em = emulate(cfg, spec, out, "faults")
    rec = json.loads((out / em["run_dir"] / "recovery.json").read_text())
    emu = Emulator(engine_config(cfg.model_copy(update={"emulate": cfg.emulate.model_copy(update={
        "hardware": spec["hardware"], "compression": float(spec["compression"])})})))
    events = []
    for ev in rec["events"]:
        if "kind" in ev:  # a heartbeat or scale event, not a recovery
            continue
        reload = emu.reload_time(ev["role"])
        real = ev.get("ready_s")
        events.append({"role": ev["role"], "replica": ev.get("replica"), "tier": ev["tier"],
                       "detect_real_s": ev.get("detect_s"), "ready_real_s": real,
                       "modelled_gpu_reload_s": round(reload, 3),
                       "recovery_s": None if real is None else round(real + reload, 3),
                       "superseded_by_global_restart": ev.get("superseded_by_global_restart", False)})
    return {"overrides": f["overrides"], "emulated": em, "events": events, "global_restarts": rec.get("global_restarts")}


def beyond(b: dict, configs: dict, spec: dict, out: Path, results: dict) -> dict:
    """Streaming + partial rollout + the simulator's best split for that engine, against the gated base."""
    from relax.sim import build
    from relax.sim.bound import pool_limits
    from relax.sim.output import mean_step_time, steady_step_time
    from relax.sim.search import search_split, with_split

    r, base = configs[b["base"]]
    steps = b.get("steps", spec["steps"])
    cfg = load_config(ROOT / r["config"], [*r["overrides"], *b["overrides"], f"steps={steps}"])
    opts = {"stream": True, "inflight": cfg.rollout.chunk_groups}
    split = None
    if b.get("search_split"):
        found = search_split(cfg, lambda c: mean_step_time(build(c, spec["hardware"], band=spec.get("band", "mid"),
                                                                  record=False, stream_groups=True,
                                                                  inflight_groups=groups_per_replica(c)).run()))
        split = found["best"]
        cfg = with_split(cfg, split["rollout_gpus"], split["actor_gpus"])
        # the claim stays each replica's share of the step, all of it in flight
        share = groups_per_replica(cfg)
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={
            "chunk_groups": share, "max_inflight": share * cfg.rollout.group_size})})
        opts["inflight"] = share
    ran = {"replicas": cfg.rollout.replicas, "chunk_groups": cfg.rollout.chunk_groups,
           "max_inflight": cfg.rollout.max_inflight}  # after the split
    row = one("beyond", cfg, spec, out, opts, {"config": r["config"], "overrides": [*r["overrides"], *b["overrides"]],
                                                "split": split, "rollout": ran, "base": b["base"], "steps": steps})
    gated = next((x for x in results["runs"] if x["name"] == b["base"]), None)
    # Shares of the bound (relax/sim/bound.py: the slowest pool; floor: with the staleness gate's latency floor).
    # A 4-step run's mean past the first favours a schedule whose rollout runs ahead (the gate admits partitions
    # 0..s at once), so the simulator's steady state (STEADY_STEPS, past the first s + 1) is given beside it.
    long = build(cfg.model_copy(update={"steps": STEADY_STEPS}), spec["hardware"], band=spec.get("band", "mid"),
                 record=False, stream_groups=True, inflight_groups=opts["inflight"]).run()
    skip = cfg.max_staleness + 1
    row["simulated_steady"] = {"steps": STEADY_STEPS, "mean_step_time_s": round(steady_step_time(long), 3),
                               "bound": pool_limits(long, range(skip, STEADY_STEPS))}
    against(row, gated, row["simulated"]["bound"], row["simulated_steady"]["bound"])
    if b.get("ablation"):  # the same run less one feature (partial rollout: what it adds over streaming alone)
        raw = cfg.model_dump(mode="json")
        raw["rollout"].update(b["ablation"])
        ab = validate(raw)  # a wrong field in the spec fails here, named
        less = against(one("beyond_ablation", ab, spec, out, opts, {"ablation": b["ablation"]}), gated,
                       row["simulated"]["bound"])  # against the run's own limits: the same work
        row["ablation"] = {**less, **{f"gain_{kind}": round(less[kind]["mean_step_time_s"] /
                                                            row[kind]["mean_step_time_s"], 3)
                                      for kind in ("emulated", "simulated")}}
    return row


def against(row: dict, gated: dict | None, lim: dict, steady: dict | None = None) -> dict:
    """`row`'s speed-up over the gated run and its shares of the limits (relax/sim/bound.py: the slowest pool's
    bound; floor: with the staleness gate's latency floor; the batch-latency trade-off), emulated and simulated
    against `lim`, the simulated steady state against `steady`."""
    kinds = [("emulated", lim), ("simulated", lim)] + ([("simulated_steady", steady)] if steady else [])
    for kind, limits in kinds:
        step_s = row[kind]["mean_step_time_s"]
        if gated is not None and kind in gated:
            row[f"speedup_vs_gated_{kind}"] = round(gated[kind]["mean_step_time_s"] / step_s, 3)
        for name, key in (("bound", "bound_step_s"), ("floor", "floor_step_s"), ("tradeoff", "tradeoff_step_s")):
            row[f"share_of_{name}_{kind}"] = round(limits[key] / step_s, 3)
    return row
