"""The simulator's study (issue 14 items 4 and 5): SIMULATED predictions at the paper's 16xH800 scale and beyond.

`relax study sim [--spec experiments/sim/variants.yaml] [--out results] [--only gate scaling ...]`

1. gate: every prediction of the spec's `gate` list at each length band (hardware at its mid values), beside the
   published value (analysis/published.py), with the effective train MFU and decode bandwidth efficiency it
   implies, each pool's limit (relax/sim/bound.py), and the same rows for the engine as built (one
   chunk_groups call at a time). No parameter is fitted to a published number here.
2. solve: for each published step time, the one value of each knob (length mean, train MFU, decode bandwidth
   efficiency; the others at mid) that makes the simulated step time equal it (bisection; "none" when no value
   in the range does): what would have to be true.
3. calibrated: ONE knob fitted to ONE published step time, the other predictions made with it (labelled).
4. scaling (16..1024 GPUs, two models), staleness s = 0..8, rollout:actor split search, max response length.

Writes `<out>/sim/sim_results.json`; analysis/sim.py draws its tables and figures. Every number is simulated.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import yaml

from relax.config import ConfigError, ExperimentConfig, load_config
from relax.sim.bound import pool_limits
from relax.sim.cost import CostModel, SimOptions
from relax.sim.hardware import HardwareProfile, Sourced, load_hardware
from relax.sim.lengths import length_model
from relax.sim.output import mean_step_time, steady_step_time
from relax.sim.search import search_split, split_candidates
from relax.sim.shapes import model_shape
from relax.sim.sim import Simulation

ROOT = Path(__file__).resolve().parents[2]
SPEC = Path(__file__).resolve().parent / "variants.yaml"
RESULTS_FILE = "sim_results.json"
PARTS = ("gate", "solve", "calibrated", "scaling", "staleness", "split", "max_length")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default=str(SPEC), help="the study's YAML (default: experiments/sim/variants.yaml)")
    p.add_argument("--out", default=str(ROOT / "results"), help="results root; writes <out>/sim/")
    p.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts")


def groups_per_replica(cfg: ExperimentConfig) -> int:
    """Each rollout replica's share of a step's groups when they are split evenly (rounded up)."""
    return math.ceil(cfg.rollout.prompts_per_step / cfg.rollout.replicas)


# --- one simulation -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Knobs:
    """What a prediction may change besides the config: the length band and, for `solve`, one value."""

    length_band: str = "mid"
    length_mean: float | None = None
    train_mfu: float | None = None
    decode_bw: float | None = None
    engine: bool = True  # the spec's engine model (inflight share + stream); False: the engine as built
    hardware: str | None = None  # a profile other than the spec's (a gate entry's `hardware`)


def _with_efficiency(hw: HardwareProfile, **values: float) -> HardwareProfile:
    eff = hw.efficiency.model_copy(update={k: Sourced(value=v, source="solved: what would have to be true")
                                           for k, v in values.items()})
    return hw.model_copy(update={"efficiency": eff})


class Study:
    def __init__(self, spec: dict):
        self.spec = spec
        self.hw = load_hardware(spec["hardware"])
        self.runs = 0

    def config(self, path: str, overrides: list[str] = ()) -> ExperimentConfig:
        return load_config(str(ROOT / path), list(overrides))

    def simulation(self, cfg: ExperimentConfig, knobs: Knobs = Knobs(), lengths: str | None = None,
                   steps: int | None = None, record: bool = False) -> Simulation:
        cfg = cfg.model_copy(update={"steps": steps or self.spec["steps"]})
        hw = load_hardware(knobs.hardware) if knobs.hardware else self.hw
        if knobs.train_mfu is not None:
            ratio = hw.efficiency.forward_mfu.value / hw.efficiency.train_mfu.value
            hw = _with_efficiency(hw, train_mfu=knobs.train_mfu, train_mfu_moe=knobs.train_mfu,
                                  forward_mfu=min(1.0, knobs.train_mfu * ratio))
        if knobs.decode_bw is not None:
            hw = _with_efficiency(hw, decode_bw=knobs.decode_bw)
        eng = self.spec["engine"] if knobs.engine else {}
        inflight = eng.get("inflight")
        if inflight == "share":
            inflight = groups_per_replica(cfg)
        opts = SimOptions(band="mid", recompute=bool(self.spec["recompute"]), stream_groups=bool(eng.get("stream")),
                          inflight_groups=inflight, packed_sequences=bool(eng.get("packed")))
        lm = length_model(cfg.task.name, cfg.rollout.max_new_tokens, knobs.length_band,
                          str(ROOT / lengths) if lengths else None)
        if knobs.length_mean is not None:
            lm = dataclasses.replace(lm, mean=knobs.length_mean, source=lm.source + f"; mean solved {knobs.length_mean:.0f}")
        self.runs += 1
        return Simulation(cfg, CostModel(cfg, model_shape(cfg), hw, opts, lm.media_tokens), lm, record=record).run()

    def step_time(self, cfg, knobs=Knobs(), lengths=None, steps=None) -> float:
        return mean_step_time(self.simulation(cfg, knobs, lengths, steps))

    def describe(self, cfg, knobs=Knobs(), lengths=None, steps=None) -> dict:
        """Step time, what it implies, each pool's limit and where the trainer's time went."""
        from relax.sim.output import critical_path

        sim = self.simulation(cfg, knobs, lengths, steps, record=True)
        t = mean_step_time(sim)
        imp = sim.cost.implied()
        return {"step_time_s": round(t, 2), "samples_per_s": round(sim.P * sim.G / t, 4),
                "effective_train_mfu": imp["effective_train_mfu"],
                "effective_decode_bw_efficiency": imp["effective_decode_bw_efficiency"],
                "assumed_train_mfu": imp["train_mfu"], "assumed_decode_bw": imp["decode_bw_efficiency"],
                "response_tokens_mean": round(sum(x for s in sim.resp for g in s for x in g) /
                                              (sim.steps * sim.P * sim.G), 1),
                "lengths": sim.lengths.source, "critical_path_s": critical_path(sim), **pool_limits(sim)}


# --- the parts ------------------------------------------------------------------------------------------------
def _pub(row):
    from analysis.published import value

    return value(*row) if row else None


def gate(st: Study) -> dict:
    out = {}
    as_built = set(st.spec.get("as_built", []))
    for g in st.spec["gate"]:
        cfg = st.config(g["config"], g.get("overrides", []))
        entry = {"config": g["config"], "overrides": g.get("overrides", []), "published": _pub(g.get("published")),
                 "published_row": g.get("published"), "bands": {}}
        entry["hardware"] = g.get("hardware", st.spec["hardware"])
        for band in st.spec["length_bands"]:
            entry["bands"][band] = st.describe(cfg, Knobs(length_band=band, hardware=g.get("hardware")),
                                               g.get("lengths"))
        if g["name"] in as_built:
            entry["as_built_mid"] = st.describe(cfg, Knobs(engine=False), g.get("lengths"))
        out[g["name"]] = entry
    return out


def ratios(st: Study, g: dict, key: str = "bands") -> list[dict]:
    rows = []
    for name, slow, fast, pub in st.spec["ratios"]:
        if slow not in g or fast not in g:
            continue
        r = {"ratio": name, "published": _pub(pub)}
        for band in st.spec["length_bands"]:
            r[band] = round(g[slow]["bands"][band]["step_time_s"] / g[fast]["bands"][band]["step_time_s"], 3)
        rows.append(r)
    for name, off, on, pub in st.spec.get("r3", []):
        if off not in g or on not in g:
            continue
        r = {"ratio": f"R3 overhead, {name} (%)", "published": _pub(pub)}
        for band in st.spec["length_bands"]:
            r[band] = round(100 * (g[on]["bands"][band]["step_time_s"] / g[off]["bands"][band]["step_time_s"] - 1), 2)
        rows.append(r)
    return rows


def _bisect(f, lo: float, hi: float, target: float, iters: int = 14) -> float | None:
    """x in [lo, hi] with f(x) = target for a monotone f; None when the target is outside f's range there."""
    flo, fhi = f(lo), f(hi)
    if not min(flo, fhi) <= target <= max(flo, fhi):
        return None
    up = fhi > flo
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if (f(mid) < target) == up:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def solve(st: Study) -> list[dict]:
    gates = {g["name"]: g for g in st.spec["gate"]}
    steps = st.spec["steps"]
    rows = []
    for name in st.spec["solve"]["targets"]:
        g = gates[name]
        cfg, target = st.config(g["config"], g.get("overrides", [])), _pub(g.get("published"))
        row = {"prediction": name, "published_s": target}
        for knob, (lo, hi) in st.spec["solve"]["knobs"].items():
            def f(x, knob=knob):
                return st.step_time(cfg, Knobs(**{knob: x}), g.get("lengths"), steps)
            try:
                x = _bisect(f, float(lo), float(hi), target)
            except ConfigError:
                x = None
            row[knob] = None if x is None else round(x, 3 if x < 10 else 0)
            row[f"{knob}_range"] = [lo, hi]
        if cfg.mode != "colocate":  # the fastest rollout:actor split of the same 16 GPUs, everything else at mid
            best = search_split(cfg, lambda c: st.step_time(c, lengths=g.get("lengths"), steps=steps))["best"]
            row["best_split"] = f"{best['rollout_gpus']}:{best['actor_gpus']} -> {best['step_time_s']:.1f} s"
        if row.get("length_mean") and cfg.mode != "colocate":
            # At that length the rollout just keeps up; for the trainer to be the bottleneck instead (the paper's
            # relax trainer waits 0.11 s a step), its work would have to fill the step: the MFU that makes it so.
            d = st.describe(cfg, Knobs(length_mean=row["length_mean"]), g.get("lengths"), steps)
            train = d["limits_s"]["actor"]
            row["train_mfu_if_trainer_bound"] = round(d["assumed_train_mfu"] * train / target, 3)
            row["effective_mfu_if_trainer_bound"] = round(d["effective_train_mfu"] * train / target, 3)
        rows.append(row)
    return rows


def calibrated(st: Study) -> dict:
    c = st.spec["calibrated"]
    gates = {g["name"]: g for g in st.spec["gate"]}
    g = gates[c["target"]]
    cfg, target = st.config(g["config"], g.get("overrides", [])), _pub(g["published"])
    lo, hi = st.spec["solve"]["knobs"][c["knob"]]
    x = _bisect(lambda v: st.step_time(cfg, Knobs(**{c["knob"]: v}), g.get("lengths")), lo, hi, target)
    out = {"knob": c["knob"], "fitted_to": c["target"], "published_s": target, "value": x, "predictions": {}}
    if x is None:
        return out
    for name in st.spec["solve"]["targets"]:
        gg = gates[name]
        d = st.describe(st.config(gg["config"], gg.get("overrides", [])), Knobs(**{c["knob"]: x}), gg.get("lengths"))
        out["predictions"][name] = {**d, "published": _pub(gg.get("published"))}
    return out


def scaled(st: Study, path: str, m: int, overrides: list[str] = ()) -> ExperimentConfig:
    """The config with every GPU pool, the rollout replicas and the prompts per step times m (weak scaling)."""
    base = st.config(path, overrides)
    r = base.resources
    extra = [f"resources.{role}.gpus={getattr(r, role).gpus * m:g}" for role in ("actor", "rollout", "reference",
                                                                                 "actor_fwd") if getattr(r, role).gpus]
    extra += [f"rollout.replicas={base.rollout.replicas * m}",
              f"rollout.prompts_per_step={base.rollout.prompts_per_step * m}",
              f"task.size={base.task.size * m}",
              # room for s = 8 partitions in flight (the bus's capacity is checked, not simulated)
              f"bus.capacity_rows={max(base.bus.capacity_rows, 10 * base.rollout.prompts_per_step * m * base.rollout.group_size)}"]
    return st.config(path, list(overrides) + extra)


def scaling(st: Study) -> list[dict]:
    sc, rows = st.spec["scaling"], []
    for model, files in sc["models"].items():
        for n in sc["gpus"]:
            m = n // 16
            a = st.describe(scaled(st, files["async"], m), steps=sc["steps"])
            c = st.describe(scaled(st, files["colocate"], m, files.get("colocate_overrides", [])), steps=sc["steps"])
            pc = _streaming(st, files["async"], m)
            p = pc and st.describe(pc, steps=sc["steps"])
            rows.append({"model": model, "gpus": n, "async_step_s": a["step_time_s"],
                         "async_partial_step_s": p and p["step_time_s"],
                         "partial_speedup": p and round(a["step_time_s"] / p["step_time_s"], 3),
                         "colocate_step_s": c["step_time_s"], "async_samples_per_s": a["samples_per_s"],
                         "colocate_samples_per_s": c["samples_per_s"],
                         "speedup_vs_colocate": round(c["step_time_s"] / a["step_time_s"], 3),
                         "async_bound_samples_per_s": a["bound_samples_per_s"], "async_slowest_pool": a["slowest_pool"],
                         "colocate_bound_samples_per_s": c["bound_samples_per_s"],
                         "async_effective_train_mfu": a["effective_train_mfu"],
                         "async_effective_decode_bw": a["effective_decode_bw_efficiency"]})
    return rows


def _streaming(st: Study, path: str, m: int, overrides: list[str] = (),
               partial: bool = True) -> ExperimentConfig | None:
    """The async config with request-level streaming (rollout.max_inflight: each replica's share of a step in flight,
    refilled across claims and steps as the engine does) and, unless `partial` is False (the ablation: streaming
    alone, whose engine drains before it loads a new version), partial rollout (in-flight requests load each new
    version and go on); None where the config refuses it (e.g. R3's routing capture is not streamed)."""
    base = st.config(path)
    share = groups_per_replica(base) * base.rollout.group_size  # requests; weak scaling keeps it at every size
    try:
        return scaled(st, path, m, [*overrides, f"rollout.partial={str(partial).lower()}",
                                    f"rollout.max_inflight={share}"])
    except ConfigError:
        return None


def staleness(st: Study) -> list[dict]:
    """Step time by max_staleness, the paper's chunked claims beside streaming that refills + partial rollout;
    the steady state past the first s + 1 steps (steady_step_time), so runs are long enough for s = 8."""
    sp, rows = st.spec["staleness"], []
    for n in sp["gpus"]:
        for s in sp["s"]:
            cfg = scaled(st, sp["config"], n // 16, [f"max_staleness={s}"])
            t = steady_step_time(st.simulation(cfg, steps=sp["steps"]))
            pc = _streaming(st, sp["config"], n // 16, [f"max_staleness={s}"])
            ps = pc and st.simulation(pc, steps=sp["steps"])
            # the ablation veRL's fully-async study makes: streaming alone
            sc = _streaming(st, sp["config"], n // 16, [f"max_staleness={s}"], partial=False)
            rows.append({"gpus": n, "max_staleness": s, "step_time_s": round(t, 2),
                         "samples_per_s": round(cfg.rollout.prompts_per_step * cfg.rollout.group_size / t, 4),
                         "streaming_step_s": round(steady_step_time(st.simulation(sc, steps=sp["steps"])), 2)
                         if sc else None,
                         "streaming_partial_step_s": ps and round(steady_step_time(ps), 2),
                         **({f"streaming_partial_{k}": v for k, v in pool_limits(ps).items()
                             if k in ("bound_step_s", "latency_floor_s", "tradeoff_step_s")} if ps else {})})
    return rows


def split(st: Study) -> list[dict]:
    sp, rows = st.spec["split"], []
    for n in sp["gpus"]:
        cfg = scaled(st, sp["config"], n // 16)
        cands = split_candidates(cfg)
        pts = sp.get("points", 16)
        if len(cands) > pts:  # a grid of about `points` splits over the range, the config's own split among them
            keep = set(cands[:: max(1, len(cands) // pts)]) | {(int(cfg.resources.rollout.gpus),
                                                                int(cfg.resources.actor.gpus))}
            cands = [c for c in cands if c in keep]
        res = search_split(cfg, lambda c: st.step_time(c, steps=sp["steps"]), candidates=cands)
        for r in res["candidates"]:
            rows.append({"gpus": n, **r, "best": r is res["best"],
                         "config_split": r["rollout_gpus"] == cfg.resources.rollout.gpus})
    return rows


def max_length(st: Study) -> list[dict]:
    ml, rows = st.spec["max_length"], []
    gates = {g["name"]: g for g in st.spec["gate"]}
    for name in ml["gate"]:
        g = gates[name]
        for L in ml["tokens"]:
            cfg = st.config(g["config"], g.get("overrides", []) + [f"rollout.max_new_tokens={L}",
                                                                   f"training.micro_batch_tokens={L + 1024}"])
            d = st.describe(cfg, lengths=g.get("lengths"), steps=ml["steps"])
            rows.append({"prediction": name, "max_new_tokens": L, "step_time_s": d["step_time_s"],
                         "response_tokens_mean": d["response_tokens_mean"], "bound_step_s": d["bound_step_s"]})
    by = {(r["prediction"], r["max_new_tokens"]): r["step_time_s"] for r in rows}
    for r in rows:
        if r["prediction"] != "colocate" and ("colocate", r["max_new_tokens"]) in by:
            r["speedup_vs_colocate"] = round(by[("colocate", r["max_new_tokens"])] / r["step_time_s"], 3)
    return rows


def main(args: argparse.Namespace) -> int:
    spec = yaml.safe_load(Path(args.spec).read_text())
    st = Study(spec)
    out_dir = Path(args.out) / "sim"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    res = json.loads(path.read_text()) if args.only and path.exists() else {}
    res.update({"simulated": True, "hardware": spec["hardware"], "spec": str(Path(args.spec).resolve().relative_to(ROOT))
                if Path(args.spec).resolve().is_relative_to(ROOT) else args.spec,
                "recompute": spec["recompute"], "engine": spec["engine"], "steps": spec["steps"]})
    timings = res.setdefault("wall_s", {})
    t_all = time.perf_counter()
    for part in PARTS:
        if args.only and part not in args.only:
            continue
        t0, n0 = time.perf_counter(), st.runs
        if part == "gate":
            res["gate"] = gate(st)
            res["ratios"] = ratios(st, res["gate"])
        else:
            res[part] = globals()[part](st)
        timings[part] = round(time.perf_counter() - t0, 2)
        print(f"[sim] {part}: {st.runs - n0} simulations in {timings[part]:.1f} s", flush=True)
    timings["total"] = round(time.perf_counter() - t_all, 2)
    path.write_text(json.dumps(res, indent=1))
    print(f"SIMULATED results: {path} ({st.runs} simulations, {timings['total']:.1f} s)")
    return 0
