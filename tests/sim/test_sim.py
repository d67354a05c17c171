"""The simulator (relax/sim/): its gate is the bus's gate, its closed forms are exact, its errors name the field.
Fast, no Ray: the Coordinator is driven as a plain class in one asyncio loop."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
from pathlib import Path

import pytest
import yaml

from relax.bus.gate import Coordinator, can_start
from relax.config import ConfigError, ExperimentConfig, load_config, validate
from relax.run_folder import RunFolder
from relax.sim.cost import CostModel, SimOptions
from relax.sim.hardware import HardwareProfile, load_hardware
from relax.sim.lengths import LengthModel, fit_mean, truncated_mean
from relax.sim.live import LiveEngine
from relax.sim.shapes import CHAR_VOCAB, HERE as MODELS, load_shape_file, model_shape
from relax.sim.sim import SimGate, Simulation
from relax.trainers.budget import budget_slices

import simpy

ROOT = Path(__file__).resolve().parents[2]

# --- the gate -----------------------------------------------------------------------------------------------
def _coordinator(s: int):
    return Coordinator.__ray_metadata__.modified_class(capacity_rows=10**6, group_size=2, max_staleness=s)


async def _admitted(coord, step: int) -> bool:
    try:
        await coord.wait_can_start(step, 0.002)
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("seed", range(4))
def test_gate_admits_what_the_bus_gate_admits(seed):
    """Random traces of train (mark_trained, in and out of order) and generate (may partition k start?) events:
    the simulator's gate, the bus Coordinator and the pure predicate give the same answer every time."""
    rng = random.Random(seed)
    s = rng.choice([0, 1, 2, 4])

    async def trace():
        coord, env = _coordinator(s), simpy.Environment()
        gate = SimGate(env, s)
        untrained, answers = list(range(40)), 0
        for _ in range(150):
            if rng.random() < 0.4 and untrained:
                # mostly in order, sometimes a later partition first (several trainers / a restarted one)
                k = untrained.pop(0 if rng.random() < 0.8 else rng.randrange(min(3, len(untrained))))
                await coord.mark_trained(k)
                gate.mark_trained(k)
            else:
                k = rng.randrange(0, 45)
                real = await _admitted(coord, k)
                ev = gate.wait_can_start(k)
                assert ev.triggered == real == can_start(k, coord.oldest, s), (k, coord.oldest, s)
                assert gate.oldest == coord.oldest
                answers += real
        return answers

    assert asyncio.run(trace()) > 0


def test_gate_wakes_a_waiter_when_training_catches_up():
    env = simpy.Environment()
    gate = SimGate(env, 1)
    ev = gate.wait_can_start(3)
    assert not ev.triggered
    gate.mark_trained(0)
    assert not ev.triggered
    gate.mark_trained(1)
    assert ev.triggered  # 3 - 2 <= 1


# --- a profile where only the stages a test names cost anything ----------------------------------------------
def _free_profile(**eff) -> dict:
    """Every link huge, every overhead zero, peak compute huge: only memory-bound decode costs time, unless a
    test puts a finite peak back."""
    hw = yaml.safe_load((load_hardware.__globals__["HERE"] / "h800.yaml").read_text())
    for section in ("rollout", "overheads"):
        for name in hw[section]:
            hw[section][name] = {"value": 0.0, "source": "assumed; test"}
    for name in ("bus_bytes_per_s", "checkpoint_bytes_per_s"):
        hw["overheads"][name] = {"value": 1e30, "source": "assumed; test"}
    hw["rollout"]["mem_fraction"] = {"value": 0.9, "source": "assumed; test"}
    hw["rollout"]["max_running_requests"] = {"value": 10**6, "source": "assumed; test"}
    for name in ("intra_node", "inter_node", "host"):
        hw["links"][name] = {"value": 1e30, "source": "assumed; test"}
    hw["links"]["latency_s"] = {"value": 0.0, "source": "assumed; test"}
    hw["device"]["peak_flops"] = {"value": 1e30, "source": "assumed; test"}
    for name in hw["efficiency"]:
        hw["efficiency"][name] = {"value": eff.get(name, 1.0), "source": "assumed; test"}
    return hw


def _cfg(**over) -> ExperimentConfig:
    raw = {"name": "simtest", "profile": "test", "mode": "async", "max_staleness": 1, "steps": 6,
           "model": {"kind": "tiny_qwen3", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                     "intermediate_size": 128},
           "rollout": {"prompts_per_step": 4, "group_size": 2, "max_new_tokens": 32, "chunk_groups": 4},
           "algorithm": {"kl_coef": 0.0},
           "bus": {"capacity_rows": 4096},
           "resources": {"rollout": {"gpus": 1}, "actor": {"gpus": 1}}}
    for key, value in over.items():
        node = raw
        *path, last = key.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = value
    return validate(raw)


def _sim(cfg, hw: dict, length: int = 20, prompt: float = 10.0, record: bool = True) -> Simulation:
    cost = CostModel(cfg, model_shape(cfg), HardwareProfile.model_validate(hw), SimOptions())
    lm = LengthModel(prompt_tokens=prompt, max_new_tokens=cfg.rollout.max_new_tokens, empirical=[length],
                     source="test")
    return Simulation(cfg, cost, lm, record=record)


def _step_times(sim) -> list[float]:
    ends = [sim.step_end[k] for k in range(sim.steps)]
    return [b - a for a, b in zip([0.0] + ends, ends)]


# --- closed forms ------------------------------------------------------------------------------------------
def test_one_stage_decode_closed_form():
    """Colocate with only decode costing: a step is B requests of length L decoded together, each step reading
    the weights and the whole KV cache: L W/bw + kv/bw (B p L + B L (L-1)/2)."""
    cfg = _cfg(mode="colocate", max_staleness=0)
    hw = _free_profile()
    sim = _sim(cfg, hw, length=20, prompt=10.0).run()
    c = sim.cost
    B, L, p = cfg.rows_per_step, 20, 10.0
    bw = hw["device"]["memory_bw"]["value"]
    W, kv = c.weight_bytes, c.shape.kv_bytes_per_token(c.dtype_bytes)
    expected = L * W / bw + kv / bw * (B * p * L + B * L * (L - 1) / 2)
    for t in _step_times(sim):
        assert t == pytest.approx(expected, rel=1e-9)


def _balanced(s: int, train_over_rollout: float = 1.0):
    """Async, one chunk per partition (it lands whole), rollout time R (memory-bound decode) and training time
    T = ratio x R; nothing else costs time."""
    cfg = _cfg(max_staleness=s, **{"bus.capacity_rows": 8 * (s + 1)})
    hw = _free_profile()
    probe = _sim(cfg, hw)
    groups = list(range(probe.P))
    R, _ = probe.cost.generate([(probe.prompt, x) for g in groups for x in probe.resp[0][g]])
    # training alone gets a small MFU, so that T = ratio x R (prefill and decode compute stay free)
    flops = probe.cost._flops(*probe.tokens(0, groups), 3.0)
    peak = hw["device"]["peak_flops"]["value"]
    hw["efficiency"]["train_mfu"] = {"value": flops / (peak * train_over_rollout * R), "source": "assumed; test"}
    sim = _sim(cfg, hw)
    T = sim.cost.train_time(*sim.tokens(0, groups))
    return sim.run(), R, T


def test_two_balanced_stages_overlap_exactly():
    sim, R, T = _balanced(1)
    assert T == pytest.approx(R, rel=1e-6)
    times = _step_times(sim)
    assert times[0] == pytest.approx(R + T, rel=1e-9)
    for t in times[1:]:
        assert t == pytest.approx(max(R, T), rel=1e-9)


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0])
def test_staleness_zero_against_infinity(ratio):
    """s = 0: rollout k waits for the weights of step k-1, so a step is R + T; s = infinity: the slower stage
    sets the pace, max(R, T) (after the first step)."""
    sim0, R, T = _balanced(0, ratio)
    for t in _step_times(sim0):
        assert t == pytest.approx(R + T, rel=1e-9)
    sim_inf, R, T = _balanced(100, ratio)
    assert sim_inf.cfg.max_staleness >= sim_inf.steps
    for t in _step_times(sim_inf)[1:]:
        assert t == pytest.approx(max(R, T), rel=1e-9)


def _live(c, reqs, cap=None, max_running=None):
    """(duration, finish times) of `reqs` run through a LiveEngine given them all at once."""
    eng = LiveEngine(c, max_running)
    if cap is not None:
        eng.cap = cap
    return eng.run(reqs)


def test_engine_fast_path_is_the_queued_path():
    """All requests fit at once: the sorted fast path gives the live engine's times exactly; a KV cache
    too small for all of them queues the rest and takes longer."""
    cfg = _cfg()
    c = CostModel(cfg, model_shape(cfg), load_hardware("h800"))
    rng = random.Random(0)
    over, arms = c.step_overhead, c.decode_arms
    for _ in range(100):
        reqs = [(float(rng.choice([5, 10])), rng.randint(1, 40)) for _ in range(rng.randint(1, 20))]
        fast = c._generate_all_admitted(reqs, over, arms)
        queued = _live(c, reqs, cap=float("inf"))
        assert fast[0] == pytest.approx(queued[0], rel=1e-12)
        assert fast[1] == pytest.approx(queued[1], rel=1e-12)
        small = _live(c, reqs, cap=max(p + n for p, n in reqs))
        assert small[0] >= fast[0] * (1 - 1e-12)


def test_a_refilled_engine_stays_full_and_beats_claim_by_claim():
    """LiveEngine fed as it goes (a streaming replica that refills): the batch stays at max_running while
    work is left, and two long-tailed claims finish sooner than run one engine call after the other."""
    cfg = _cfg()
    c = CostModel(cfg, model_shape(cfg), load_hardware("h800"))
    one = [(10.0, 40)] + [(10.0, 4)] * 7  # one long response per claim: its tail decodes at batch 1
    two = one + one
    calls = [c.generate(one, 8)[0] for _ in range(2)]
    eng, queue, batches = LiveEngine(c, 8), list(range(len(two))), []
    while queue or len(eng):
        while eng.free() and queue:
            i = queue.pop(0)
            eng.add(i, *two[i])
        batches.append((len(eng), bool(queue)))
        eng.advance()
    assert all(n == 8 for n, left in batches if left) and len(batches) > 2  # refilled as soon as a slot frees
    assert eng.t < sum(calls)
    assert eng.t == pytest.approx(c.generate(two, 8)[0], rel=1e-12)  # the same FIFO work, fed or given at once


@pytest.mark.parametrize("s", [0, 1, 2, 3])
def test_staleness_never_exceeds_the_bound(s):
    cfg = _cfg(max_staleness=s, steps=10, **{"rollout.chunk_groups": 1, "rollout.replicas": 1})
    hw = load_hardware("h800").model_dump()
    sim = Simulation(cfg, CostModel(cfg, model_shape(cfg), HardwareProfile.model_validate(hw)),
                     LengthModel(prompt_tokens=10, max_new_tokens=32, mean=12, cv=0.8, source="test")).run()
    stale = [k - v for k in range(sim.steps) for v in sim.group_version[k]]
    assert max(stale) <= s
    if s > 0:
        assert max(stale) >= 1  # rollout does run ahead when it may


def test_every_schedule_runs_and_writes_a_simulated_run_folder(tmp_path):
    from relax.sim.output import write_run

    for i, over in enumerate(({"mode": "colocate", "max_staleness": 0}, {}, {"schedule": "verl"},
                              {"schedule": "openrlhf", "max_staleness": 2})):
        cfg = _cfg(**{"algorithm.kl_coef": 0.001, "resources.reference": {"gpus": 1}, **over})
        sim = Simulation(cfg, CostModel(cfg, model_shape(cfg), load_hardware("h100")),
                         LengthModel(prompt_tokens=10, max_new_tokens=32, mean=12, cv=0.5, source="test")).run()
        folder, summary = write_run(sim, cfg, str(tmp_path), "h100", "2x h100", run=f"r{i}")
        assert summary["simulated"] is True and summary["hardware"] == "h100"
        assert summary["steps"] == cfg.steps and summary["mean_step_time_s"] > 0
        rows = RunFolder(folder.path).metrics()
        assert all(r["simulated"] is True for r in rows) and len(rows) == cfg.steps
        assert json.loads((folder.path / "trace.json").read_text())["simulated"] is True
        assert "simulated: true" in (folder.path / "config.yaml").read_text()
        assert RunFolder(folder.path).spans(), "trace.json reads back as spans"
        assert folder.profile == "test-sim-h100"


# --- errors name the field ------------------------------------------------------------------------------------
def _write(tmp_path, hw: dict):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(hw))
    return p


def test_profile_errors_name_the_field(tmp_path):
    base = yaml.safe_load((load_hardware.__globals__["HERE"] / "h800.yaml").read_text())
    hw = copy.deepcopy(base)
    del hw["efficiency"]["train_mfu"]
    with pytest.raises(ConfigError, match=r"efficiency\.train_mfu"):
        load_hardware(_write(tmp_path, hw))
    hw = copy.deepcopy(base)
    hw["device"]["memory_bw"]["value"] = -1
    with pytest.raises(ConfigError, match=r"device\.memory_bw\.value"):
        load_hardware(_write(tmp_path, hw))
    hw = copy.deepcopy(base)
    hw["efficiency"]["decode_bw"]["value"] = 1.5
    with pytest.raises(ConfigError, match=r"decode_bw"):
        load_hardware(_write(tmp_path, hw))
    hw = copy.deepcopy(base)
    hw["links"]["host"]["source"] = ""
    with pytest.raises(ConfigError, match=r"links\.host\.source"):
        load_hardware(_write(tmp_path, hw))
    hw = copy.deepcopy(base)
    hw["device"]["colour"] = "green"
    with pytest.raises(ConfigError, match=r"device\.colour"):
        load_hardware(_write(tmp_path, hw))
    with pytest.raises(ConfigError, match="--hardware"):
        load_hardware("no-such-gpu")


def test_config_errors_name_the_field():
    cfg = _cfg(**{"model": {"kind": "hf", "path": "/models/Unknown-7B", "tokenizer": "hf"}})
    with pytest.raises(ConfigError, match=r"model\.path"):
        model_shape(cfg)
    cfg = _cfg(**{"resources.rollout": {"gpus": 0}})
    with pytest.raises(ConfigError, match=r"resources\.rollout\.gpus"):
        CostModel(cfg, model_shape(cfg), load_hardware("h800")).role_devices("rollout")
    with pytest.raises(ConfigError, match=r"algorithm\.advantage"):
        _sim(_cfg(**{"algorithm.advantage": "gae"}), _free_profile())


def test_every_shipped_profile_loads_and_sources_every_number():
    for name in ("h800", "h100", "h200", "a100"):
        hw = load_hardware(name)
        assert hw.name == name and hw.device.peak_flops.value > 1e14
        assert "device.peak_flops" not in hw.assumptions()


def test_the_host_twin_prices_host_work_as_an_emulated_run_pays_it():
    """relax.sim.hardware.on_host: the target's GPUs with the host's work `compression` times heavier. A host whose
    costs are exactly the target's own over the compression gives back the target's step; a slower host a longer
    step, its sources saying where each number comes from."""
    from relax.emulate import engine_config
    from relax.sim import build
    from relax.sim.hardware import HOST_RATES, HOST_WORK, on_host
    from relax.sim.measure import host_overheads

    h800, c = load_hardware("h800"), 100.0
    o = h800.overheads  # (no bus_call_s: one RPC stands in for it, as in relax.sim.cost.CostModel.bus_time)
    same = {n: {"value": (getattr(o, n) or o.rpc_s).value * (c if n in HOST_RATES else 1 / c), "source": "as h800"}
            for n in HOST_WORK}
    twin = on_host(h800, same, c)
    assert twin.device == h800.device and twin.efficiency == h800.efficiency and twin.rollout == h800.rollout
    assert twin.overheads.rpc_s.value == pytest.approx(h800.overheads.rpc_s.value)
    assert "x100 compression" in twin.overheads.bus_row_s.source and twin.name == "h800-on-host"
    cfg = load_config(ROOT / "experiments/colocate/h800x16.yaml", ["steps=2"])
    step = {name: _step_times(build(cfg, hw, record=False).run()) for name, hw in (("h800", "h800"), ("twin", twin))}
    assert step["twin"] == pytest.approx(step["h800"], rel=1e-9)
    slower = on_host(h800, {n: {**v, "value": v["value"] * (0.5 if n in HOST_RATES else 2)} for n, v in same.items()},
                     c)
    assert sum(_step_times(build(cfg, slower, record=False).run())) > sum(step["h800"])
    # host_overheads measures these on the stand-in config an emulated run of `cfg` runs (its task's reward)
    import contextlib

    import relax.sim.measure as measure

    ray = {n: {"value": 1e-3, "source": "measured (stub)"} for n in ("rpc_s", "bus_row_s", "bus_call_s")}
    ray["bus_bytes_per_s"] = {"value": 1e9, "source": "measured (stub)"}
    orig = measure._ray_costs, measure.bus_session
    measure._ray_costs = lambda *a, **k: dict(ray, cores=k.get("cores"))
    measure.bus_session = contextlib.contextmanager(lambda cfg: (yield None))
    try:
        got = host_overheads(engine_config(load_config(ROOT / "experiments/async/h800x16.yaml",
                                                       ["emulate.hardware=h800"])), reps=1)
    finally:
        measure._ray_costs, measure.bus_session = orig
    assert got.pop("cores") is False  # the cores' background is a CPU profile's, not the host twin's
    assert "basic_arithmetic" in got["reward_per_sample_s"]["source"] and set(got) == set(HOST_WORK)
    on_host(h800, got, c)


# --- shapes and lengths ---------------------------------------------------------------------------------------
def test_shapes_derive_the_model_cards_totals():
    q4 = load_shape_file(MODELS / "qwen3-4b.yaml")
    assert q4.total_params == pytest.approx(4.0e9, rel=0.02)
    assert q4.total_params - q4.embedding_params == pytest.approx(3.6e9, rel=0.02)
    moe = load_shape_file(MODELS / "qwen3-30b-a3b.yaml")
    assert moe.total_params == pytest.approx(30.5e9, rel=0.01)
    assert moe.active_params + moe.vocab_size * moe.hidden_size == pytest.approx(3.3e9, rel=0.03)
    from relax.models.tokenizer import CharTokenizer

    assert CHAR_VOCAB == CharTokenizer.vocab_size


def test_omni_towers_add_their_media_forward_to_every_pass_over_a_sample(tmp_path):
    """The omni shape's towers (a frozen ViT of 4 patches per token, an audio encoder of 1): each sample's media cost
    one tower forward in prefill, in a log-prob forward and in a training pass; a trained tower costs three in
    training; a length file naming a tower the model lacks, or more media than prompt, fails naming the field."""
    from relax.sim.lengths import load_length_file

    omni = load_shape_file(MODELS / "qwen3-omni-30b-a3b-instruct.yaml")
    vision, audio = omni.towers
    assert (vision.name, audio.name) == ("vision", "audio")
    assert vision.params == 27 * (4 * 1152 ** 2 + 2 * 1152 * 4304)
    assert vision.forward_flops_per_token() == 2 * vision.params * 4
    cfg = load_config(ROOT / "experiments/omni/h800x16.yaml", ["steps=2"])
    hw = load_hardware("h800")
    media = {"vision": 100.0, "audio": 50.0}
    plain, c = CostModel(cfg, omni, hw), CostModel(cfg, omni, hw, media_tokens=media)
    per_sample = 100 * vision.forward_flops_per_token() + 50 * audio.forward_flops_per_token()
    assert c.media_fwd == c.media_train == pytest.approx(per_sample)
    assert c._flops(1000.0, 1e5, 3.0, rows=4) - plain._flops(1000.0, 1e5, 3.0) == pytest.approx(4 * per_sample)
    assert c.forward_time(1000.0, 1e5, "reference", rows=4) > plain.forward_time(1000.0, 1e5, "reference")
    prefill = (c.prefill_time([200.0] * 3) - plain.prefill_time([200.0] * 3)) * c.replica_devices * c.peak
    assert prefill * c.eff["prefill"] == pytest.approx(3 * per_sample)
    import dataclasses

    trained = dataclasses.replace(omni, towers=(dataclasses.replace(vision, trained=True), audio))
    t = CostModel(cfg, trained, hw, media_tokens=media)
    assert t.media_train == pytest.approx(per_sample + 2 * 100 * vision.forward_flops_per_token())
    with pytest.raises(ConfigError, match="media_tokens: .* no tower video"):
        CostModel(cfg, omni, hw, media_tokens={"video": 10.0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: t\nprompt_tokens: {value: 100, source: x}\nmean: {value: 50, source: x}\n"
                   "cv: {value: 0.5, source: x}\nmedia_tokens: {vision: {value: 150, source: x}}\n")
    with pytest.raises(ConfigError, match="media_tokens"):
        load_length_file(bad, 200)


def test_truncated_lengths():
    assert truncated_mean(100, 0.0, 50) == 50
    m = fit_mean(300, 0.7, 1000)
    assert truncated_mean(m, 0.7, 1000) == pytest.approx(300, rel=1e-6)
    rng = random.Random(0)
    lm = LengthModel(prompt_tokens=1, max_new_tokens=1000, mean=m, cv=0.7)
    draws = [x for _ in range(4000) for x in lm.draw_group(rng, 1)]
    assert max(draws) <= 1000
    assert sum(draws) / len(draws) == pytest.approx(300, rel=0.05)


# --- relax profile ------------------------------------------------------------------------------------------
def test_profile_measures_a_loadable_cpu_profile(tmp_path):
    """`relax profile` writes what it times as measured and its defaults as assumed, in the schema the
    simulator loads; a simulation on it runs."""
    from relax.sim.measure import measure

    cfg = _cfg(**{"resources.rollout": {"threads": 1}, "resources.actor": {"threads": 1},
                  "task.name": "basic_arithmetic", "rollout.max_new_tokens": 4})
    prof = measure(cfg, ray_costs=False, reps=1)
    prof.pop("prompt_tokens_mean")
    p = tmp_path / "cpu.yaml"
    p.write_text(yaml.safe_dump(prof))
    hw = load_hardware(p)
    assert hw.measured and hw.kind == "cpu"
    assert hw.threads == {"rollout": 1, "actor": 1, "forward": cfg.resources.reference.threads}  # what it timed at
    sources = {f"{section}.{name}": v.source for section in ("device", "links", "efficiency", "rollout", "overheads")
               for name, v in getattr(hw, section) if v is not None}
    timed = {"device.peak_flops", "device.memory_bw", "links.host", "links.intra_node", "efficiency.train_mfu",
             "efficiency.forward_mfu",
             "efficiency.prefill", "rollout.step_overhead_s", "overheads.sleep_wake_fixed_s",
             "overheads.optimizer_bytes_per_param", "overheads.reward_per_sample_s", "overheads.train_micro_batch_s",
             "overheads.forward_call_s", "overheads.checkpoint_bytes_per_s"}
    # what it times says measured; a default or convention says assumed, never measured (without --ray: the
    # bus and RPC costs too), so the simulator's summary lists it under `assumed`
    not_timed = {"device.memory_bytes", "links.inter_node", "links.latency_s",
                 "efficiency.decode_bw", "overheads.rpc_s", "overheads.bus_row_s", "overheads.bus_bytes_per_s"}
    assert {k for k, src in sources.items() if src.startswith("measured (")} >= timed
    assert all(sources[k].startswith("assumed (not measured: ") for k in not_timed), sources
    assert all(src.startswith(("measured (", "assumed (not measured: ")) for src in sources.values()), sources
    assert not_timed <= set(hw.assumptions()) and not timed & set(hw.assumptions())
    assert hw.rollout.step_overhead_s.value > 0 and hw.device.peak_flops.value > 1e8
    sim = Simulation(cfg, CostModel(cfg, model_shape(cfg), hw),
                     LengthModel(prompt_tokens=10, max_new_tokens=4, mean=3, cv=0.5, source="test")).run()
    assert len(sim.step_end) == cfg.steps


# --- bus calls and idle consumers ---------------------------------------------------------------------------
def test_colocate_pays_one_bus_call_per_stage_and_one_fetch_for_the_actor():
    """Colocate, one engine call per partition, no Reference: the rollout's put, Reward's and Advantages' fetch +
    write, and the Actor's one fetch of the whole partition (however many micro-batches it trains) are 4 bus
    calls per step: a per-call cost X adds exactly 4 X to every step."""
    cfg = _cfg(mode="colocate", max_staleness=0, **{"training.micro_batch_tokens": 16})
    base = _step_times(_sim(cfg, _free_profile()).run())
    hw = _free_profile()
    hw["overheads"]["bus_call_s"] = {"value": 0.25, "source": "assumed; test"}
    sim = _sim(cfg, hw).run()
    assert len(sim.micro_batches(0, list(range(sim.P)))) > 1  # several micro-batches, still one fetch
    for t, t0 in zip(_step_times(sim), base):
        assert t == pytest.approx(t0 + 4 * 0.25, rel=1e-9)


def test_a_micro_batch_and_a_forward_cost_their_rows_padded_to_the_longest_as_the_trainer_pads_them():
    """Responses of 2 or 30 tokens: each training micro-batch costs rows x its longest sequence (the torch and
    Megatron trainers right-pad a micro-batch), each Reference forward the same per budget_slices slice, at peak x
    MFU; the implied MFU counts only the sequences' own FLOPs, so it reads below the profile's."""
    cfg = _cfg(mode="colocate", max_staleness=0, **{"algorithm.kl_coef": 0.1, "training.micro_batch_tokens": 96,
                                                   "resources.reference.gpus": 1})
    hw = _free_profile()
    hw["device"]["peak_flops"] = {"value": 1e9, "source": "assumed; test"}
    cost = CostModel(cfg, model_shape(cfg), HardwareProfile.model_validate(hw), SimOptions())
    lm = LengthModel(prompt_tokens=10.0, max_new_tokens=32, empirical=[2, 30], source="test")
    sim = Simulation(cfg, cost, lm).run()
    s = cost.shape

    def flops(lengths, passes):
        return passes * sum(2.0 * s.active_params * x + 2.0 * s.num_layers * s.attn_width * x * x for x in lengths)

    train = [sp for sp in sim.spans if sp.name == "train_micro_batch"]
    ref = [sp for sp in sim.spans if sp.name == "ref_log_probs"]
    padded_any = False
    for k in range(sim.steps):
        mbs = sim.micro_batches(k, sim.order[k])
        for mb, sp in zip(mbs, [sp for sp in train if sp.step == k]):
            seqs = sim.seqs(k, mb)
            padded_any |= len(set(seqs)) > 1
            assert sp.end - sp.start == pytest.approx(flops([max(seqs)] * len(seqs), 3.0) / 1e9, rel=1e-9)
        seqs = sim.seqs(k, sim.order[k])
        slices = budget_slices(seqs, 96)
        assert len(slices) > 1
        forward = sum(flops([max(seqs[lo:hi])] * (hi - lo), 1.0) for lo, hi in slices) / 1e9
        [sp] = [sp for sp in ref if sp.step == k]
        assert sp.end - sp.start == pytest.approx(forward, rel=1e-9)
    assert padded_any
    own = sum(flops(sim.seqs(k, sim.order[k]), 3.0) for k in range(sim.steps))
    assert cost.acc["train_flops"] == pytest.approx(own, rel=1e-9)
    assert cost.acc["train_flops"] / (1e9 * cost.acc["train_s"]) < 0.9  # the padding is time without useful FLOPs
    # A trainer that packs (SimOptions.packed_sequences, `relax simulate --packed`) computes only the sequences' own FLOPs
    packed = CostModel(cfg, model_shape(cfg), HardwareProfile.model_validate(hw), SimOptions(packed_sequences=True))
    Simulation(cfg, packed, lm).run()
    assert packed.acc["train_flops"] / (1e9 * packed.acc["train_s"]) == pytest.approx(1.0, rel=1e-9)


def test_the_actors_checkpoint_adds_its_bytes_over_the_nodes_write_bandwidth_every_checkpoint_every_steps():
    """health.checkpoint_every = 2: every second step ends with the Actor writing fp32 weights, the bf16 copy Megatron
    trains and two Adam moments (14 bytes a parameter) at checkpoint_bytes_per_s per node; the other steps are as
    without a checkpoint (0: never)."""
    cfg = _cfg(mode="colocate", max_staleness=0, **{"health.checkpoint_every": 2})
    base = _step_times(_sim(_cfg(mode="colocate", max_staleness=0, **{"health.checkpoint_every": 0}),
                            _free_profile()).run())
    hw = _free_profile()
    hw["overheads"]["checkpoint_bytes_per_s"] = {"value": 1e6, "source": "assumed; test"}
    sim = _sim(cfg, hw).run()
    nodes = -(-cfg.resources.actor.gpus // 8)
    write = sim.cost.shape.total_params * 14 / (nodes * 1e6)
    assert write > 0.1
    steps = _step_times(sim)
    for k, (t, t0) in enumerate(zip(steps, base)):
        assert t == pytest.approx(t0 + (write if (k + 1) % 2 == 0 else 0.0), rel=1e-9), k


def _cpu_profile(cores: int, **overheads) -> dict:
    hw = _free_profile()
    hw["kind"] = "cpu"
    hw["device"]["per_node"] = {"value": cores, "source": "assumed; test"}
    for name, value in overheads.items():
        hw["overheads"][name] = {"value": value, "source": "assumed; test"}
    return hw


@pytest.mark.parametrize("cores", [1, 2])
def test_the_sessions_background_cores_stretch_role_work_on_fewer_than_every_core(cores):
    """background_cores b on P cores leaves the roles 1 - b/P of each: colocate's one-thread roles on P = 2, where
    every second passes in a role's work, take exactly 1 / (1 - b/P) as long. On P = 1 the same work holds every
    core: `relax profile --ray` timed it beside that background already, so it is not stretched again."""
    cfg = _cfg(mode="colocate", max_staleness=0)
    base = _step_times(_sim(cfg, _cpu_profile(cores, bus_call_s=0.25)).run())
    loaded = _step_times(_sim(cfg, _cpu_profile(cores, bus_call_s=0.25, background_cores=0.5)).run())
    assert base[0] > 0
    for t, t0 in zip(loaded, base):
        assert t == pytest.approx(t0 / 0.75 if cores == 2 else t0, rel=1e-9)


def test_profile_with_ray_times_the_work_inside_an_idle_session(monkeypatch):
    """`relax profile --ray` times the engine, the trainer and the bus inside a session of the config left idle
    (Ray and the bus up, the DCS members heartbeating): the background a run's work shares the cores with.
    Without --ray nothing is started."""
    import contextlib

    import relax.sim.measure as measure

    log = []

    def ctx(name):
        @contextlib.contextmanager
        def cm(cfg):
            log.append(f"enter {name}")
            yield name
            log.append(f"exit {name}")
        return cm

    monkeypatch.setattr(measure, "bus_session", ctx("session"))
    monkeypatch.setattr(measure, "idle_session", ctx("idle"))
    monkeypatch.setattr(measure, "_work", lambda cfg, reps: log.append("work") or
                        {"overheads": {}, "prompt_tokens_mean": 3.0})
    monkeypatch.setattr(measure, "_ray_costs", lambda cfg, bus, p, reps: log.append(f"ray {bus} {p}") or {"rpc_s": 1})
    prof = measure.measure(_cfg(), ray_costs=True, reps=1)
    assert log == ["enter session", "enter idle", "work", "ray session 3.0", "exit idle", "exit session"]
    assert prof["overheads"] == {"rpc_s": 1}
    log.clear()
    measure.measure(_cfg(), ray_costs=False, reps=1)
    assert log == ["work"]


def test_a_measured_cpu_profile_refuses_a_config_run_at_other_threads():
    """A measured CPU profile times each kind of work at the config's threads; a config whose roles run other
    counts would be priced at the wrong speed, so building it fails naming the role's threads field."""
    hw = _cpu_profile(2)
    hw["threads"] = {"rollout": 1, "actor": 1, "forward": 1}
    cfg = _cfg(**{"resources.rollout": {"gpus": 1, "threads": 1}, "resources.actor": {"gpus": 1, "threads": 1}})
    _sim(cfg, hw).run()  # the threads it was timed at: fine
    two = _cfg(**{"resources.rollout": {"gpus": 1, "threads": 1}, "resources.actor": {"gpus": 1, "threads": 2}})
    with pytest.raises(ConfigError, match=r"resources\.actor\.threads: 2, .* at 1 thread"):
        _sim(two, hw)
    ref = _cfg(**{"algorithm.kl_coef": 0.1, "resources.reference": {"gpus": 1, "threads": 2},
                  "resources.rollout": {"gpus": 1, "threads": 1}, "resources.actor": {"gpus": 1, "threads": 1}})
    with pytest.raises(ConfigError, match=r"resources\.reference\.threads: 2, .*\(forward\)"):
        _sim(ref, hw)
    del hw["threads"]  # a profile that does not say (a datasheet's, or one measured before the record): unchecked
    _sim(two, hw)


@pytest.mark.parametrize("cores", [1, 2])
def test_a_bus_calls_parallel_cpu_takes_a_core_the_caller_does_not_wait_for(cores):
    """bus_parallel_cpu_s Y: each of colocate's 4 bus calls a step burns Y more in the bus's own processes. On one
    core the next stage waits for it (+4Y a step); on two it runs beside the caller's lane and costs no time."""
    cfg = _cfg(mode="colocate", max_staleness=0)
    base = _step_times(_sim(cfg, _cpu_profile(cores, bus_call_s=0.25)).run())
    busy = _step_times(_sim(cfg, _cpu_profile(cores, bus_call_s=0.25, bus_parallel_cpu_s=0.125)).run())
    extra = 4 * 0.125 if cores == 1 else 0.0
    for t, t0 in zip(busy, base):
        assert t == pytest.approx(t0 + extra, rel=1e-9)


@pytest.mark.parametrize("lands", [2.0, 0.25])
def test_an_idle_consumer_looks_once_then_holds_no_core_and_wakes_one_notice_after_the_rows_land(lands):
    """As relax.bus.Bus.fetch(wait=...) waits: a lookup that finds nothing (bus_call_s, its caller holding no core;
    the bus's processes burn bus_parallel_cpu_s on a core of their own), then blocked in the coordinator, not
    polling: every core free while it waits. It goes on one control RPC (the producer's notice) after the rows
    land, or after its lookup if they landed during it."""
    hw = _cpu_profile(2, rpc_s=0.125, bus_call_s=0.5, bus_parallel_cpu_s=1.0)
    sim = _sim(_cfg(), hw, record=False)
    env, landed, seen = sim.env, sim.env.event(), []

    def producer():
        yield env.timeout(lands)
        seen.append(sim.cores.level)  # both cores free once the bus's CPU for the lookup is done
        landed.succeed()

    def consumer():
        yield from sim.idle(landed)
        seen.append(env.now)

    env.process(producer())
    env.process(consumer())
    env.run()
    assert seen == ([2, 2.125] if lands == 2.0 else [1, 0.625])
    assert sim.bus_calls == {"empty_fetch": 1} and sim.core_s == pytest.approx(1.0)


@pytest.mark.slow  # a Ray session and TransferQueue: about 30 s on 2 busy cores
def test_profile_with_ray_times_the_bus_itself():
    """`relax profile --ray` times relax.bus over TransferQueue (not a bare Ray put): a per-call and a per-row
    cost from two batch sizes; the profile loads back with them."""
    from relax.sim.measure import _ray_costs, bus_session, idle_session

    cfg = _cfg(**{"task.name": "basic_arithmetic", "rollout.max_new_tokens": 8})
    with bus_session(cfg) as bus, idle_session(cfg):
        costs = _ray_costs(cfg, bus, prompt_tokens=12.0, reps=2)
    for name in ("bus_row_s", "bus_call_s"):
        assert costs[name]["source"].startswith("measured (relax.bus"), name
    assert costs["bus_call_s"]["value"] > 0
    # The infrastructure's share of the cores: an idle session is never free (Ray, heartbeats), never the machine.
    assert 0 < costs["background_cores"]["value"] < (os.cpu_count() or 1)
    assert {"bus_parallel_cpu_s", "bus_parallel_cpu_row_s"} <= set(costs)
    # the bus's own CPU is timed as stages use it: a put by one role process waking another's blocked fetch, in the
    # bus's processes (what the gate's "bus" group measures in a run), and it is never free
    assert "blocked in fetch(wait)" in costs["bus_parallel_cpu_s"]["source"]
    assert "relax.bus.PROCESSES" in costs["bus_parallel_cpu_s"]["source"]
    assert costs["bus_parallel_cpu_s"]["value"] + 16 * costs["bus_parallel_cpu_row_s"]["value"] > 0
    hw = _free_profile()
    hw["overheads"].update(costs)
    assert HardwareProfile.model_validate(hw).overheads.bus_call_s.value == costs["bus_call_s"]["value"]
