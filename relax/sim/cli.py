"""`relax simulate CONFIG [key=value ...] [--hardware NAME]`: the experiment in simulated time.

Prints step time, steps/hour, per-role utilisation and the trainer's critical path, and writes a run folder
`<out>/<experiment>/<profile>-sim-<hardware>/<run>/` in our results schema (every file flagged simulated).
"""

from __future__ import annotations

import json
import time


def register(sub) -> None:
    p = sub.add_parser("simulate", help="simulate an experiment on a hardware profile (cost model + SimPy); "
                       "writes a run folder flagged simulated")
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. max_staleness=2")
    p.add_argument("--hardware", help="profile name (relax/sim/hardware/) or YAML path (default: h800 for a GPU "
                   "profile)")
    p.add_argument("--steps", type=int, help="number of training steps (overrides `steps`)")
    p.add_argument("--band", choices=["low", "mid", "high"], default="mid",
                   help="which end of each sourced band to take (efficiencies, overheads, lengths)")
    p.add_argument("--lengths", help="a length file (YAML) or a run folder to fit the response lengths to")
    p.add_argument("--recompute", action="store_true", help="full activation recompute in training")
    p.add_argument("--length-band", choices=["low", "mid", "high"], help="the length model's band apart from "
                   "--band's (default: --band)")
    p.add_argument("--stream", action="store_true", help="simulator-side: a group lands when its last response "
                   "finishes, not when the engine call ends (the engine does not do this yet: issue 15)")
    p.add_argument("--inflight", type=int, metavar="GROUPS", help="simulator-side: groups one replica keeps in "
                   "its engine at once (default: rollout.chunk_groups)")
    p.add_argument("--packed", action="store_true", help="simulator-side: the trainer packs each micro-batch's "
                   "sequences without padding (Megatron THD); our trainers pad each to its longest row")
    p.add_argument("--search", choices=["split"], help="split: simulate every rollout:actor GPU split of the "
                   "cluster and print the fastest (writes no run folder)")
    p.add_argument("--out", default="results", help="results root (default: results)")
    p.add_argument("--run", help="run folder name (default: timestamp)")
    p.add_argument("--no-write", action="store_true", help="print only, write no run folder")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=main)
    from relax.sim.measure import register as register_profile

    register_profile(sub)


def main(args) -> int:
    from relax.config import load_config
    from relax.sim import build, devices_label
    from relax.sim.output import metrics_rows, summarize, write_run

    overrides = list(args.overrides) + ([f"steps={args.steps}"] if args.steps is not None else [])
    cfg = load_config(args.config, overrides)
    hardware = args.hardware or ("h800" if cfg.profile.startswith("h800") else cfg.profile)
    opts = dict(band=args.band, recompute=args.recompute, lengths=args.lengths, length_band=args.length_band,
                stream_groups=args.stream, inflight_groups=args.inflight, packed_sequences=args.packed)
    if args.search == "split":
        return _search_split(cfg, hardware, opts, args.json)
    t0 = time.perf_counter()
    sim = build(cfg, hardware, **opts).run()
    wall = time.perf_counter() - t0
    hw_name, devices = sim.cost.hw.name, devices_label(cfg, sim.cost.hw)
    if args.no_write:
        summary, where = summarize(sim, metrics_rows(sim, hw_name), hw_name, devices), None
    else:
        folder, summary = write_run(sim, cfg, args.out, hw_name, devices, args.run)
        where = folder.path
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(summary, wall))
    if where:
        print(f"results (simulated): {where}")
    return 0


def format_summary(s: dict, wall_s: float | None = None) -> str:
    lines = [f"SIMULATED, {s['environment']['hardware'].removeprefix('simulated: ')} ({s['experiment']}/{s['profile']}, {s['mode']}, "
             f"schedule {s['schedule']}, max_staleness {s['max_staleness']}, band {s['implied']['band']})",
             f"  step time {s['mean_step_time_s']:.3f} s (past the first; "
             f"{s['steady_step_time_s']:.3f} s past the first max_staleness + 1)   "
             f"steps/hour {s['steps_per_hour']:.2f}   "
             f"tokens/s {s['tokens_per_s']:.0f}   response tokens/sample {s['response_tokens_mean']:.1f}",
             f"  trainer wait share {s['trainer_wait_share']:.3f}   staleness max {s['staleness_max']}"
             + (f"   sleep/wake per step {s['sleep_wake_s_mean']:.2f} s" if "sleep_wake_s_mean" in s else ""),
             "  utilisation: " + ", ".join(f"{r} {u:.0%}" for r, u in s["utilisation"].items()),
             "  trainer critical path (s): " + ", ".join(f"{c} {v:.1f}" for c, v in s["critical_path_s"].items()),
             f"  implied: train MFU {s['implied']['train_mfu']:.2f}, forward MFU {s['implied']['forward_mfu']:.2f}, "
             f"decode bandwidth efficiency {s['implied']['decode_bw_efficiency']:.2f}"
             + (f"; effective: train MFU {s['implied']['effective_train_mfu']:.3f}, decode bandwidth "
                f"{s['implied']['effective_decode_bw_efficiency']:.3f}"
                if s['implied'].get('effective_train_mfu') is not None
                and s['implied'].get('effective_decode_bw_efficiency') is not None else "")
             + (f", KV tokens/replica {s['implied']['kv_capacity_tokens_per_replica']}"
                if s['implied'].get('kv_capacity_tokens_per_replica') else ""),
             f"  lengths: {s['lengths']}"]
    if wall_s is not None:
        lines.append(f"  (simulated {s['steps']} steps in {wall_s:.2f} s)")
    return "\n".join(lines)


def _search_split(cfg, hardware: str, opts: dict, as_json: bool) -> int:
    from relax.sim import build
    from relax.sim.output import mean_step_time
    from relax.sim.search import search_split

    res = search_split(cfg, lambda c: mean_step_time(build(c, hardware, record=False, **opts).run()))
    if as_json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"SIMULATED split search on {hardware} ({cfg.name}/{cfg.profile}; reference and actor_fwd fixed)")
    for r in res["candidates"]:
        mark = "  <- best" if r is res["best"] else ""
        t = f"{r['step_time_s']:.1f} s/step" if r["step_time_s"] is not None else f"does not fit: {r['error']}"
        print(f"  rollout {r['rollout_gpus']:>4} : actor {r['actor_gpus']:>4} GPUs   {t}{mark}")
    return 0
