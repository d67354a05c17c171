"""Emulated GPUs (relax/emulate/): the stand-in config, the emulated engine's pacing, and a live emulated run at
the paper's shape with a rollout replica killed mid-run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relax.config import ConfigError, load_config
from relax.emulate import Emulator, engine_config, emulator

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ROOT / "experiments/async/h800x16.yaml"


def test_stand_in_keeps_the_target_and_asks_for_no_gpu():
    cfg = engine_config(load_config(ASYNC, ["emulate.hardware=h800", "steps=3"]))
    assert cfg.emulate.target["resources"]["actor"]["gpus"] == 8 and cfg.emulate.target["model"]["kind"] == "hf"
    assert all(getattr(cfg.resources, r).gpus == 0 for r in ("actor", "rollout", "reference", "actor_fwd"))
    assert cfg.model.kind == "tiny_qwen3" and cfg.training.trainer == "torch" and cfg.rollout.replicas == 4
    assert cfg.rollout.max_new_tokens == -(-20480 // cfg.emulate.token_scale)
    assert engine_config(cfg) is cfg  # already the stand-in


def test_colocate_stand_in_is_one_process_for_every_engine():
    cfg = engine_config(load_config(ROOT / "experiments/colocate/h800x16.yaml", ["emulate.hardware=h800"]))
    assert cfg.rollout.replicas == 1 and cfg.rollout.chunk_groups == cfg.rollout.prompts_per_step
    assert cfg.emulate.target["rollout"]["replicas"] == 16


def test_bad_emulate_values_name_the_field():
    with pytest.raises(ConfigError, match="emulate.hardware"):
        engine_config(load_config(ASYNC, ["emulate.hardware=nosuchgpu"]))
    with pytest.raises(ConfigError, match="emulate.compression"):
        load_config(ASYNC, ["emulate.hardware=h800", "emulate.compression=0.5"])
    with pytest.raises(ConfigError, match="emulate.bogus"):
        load_config(ASYNC, ["emulate.bogus=1"])


def test_sample_lengths_are_the_simulators_draw():
    from relax.sim import build

    cfg = engine_config(load_config(ASYNC, ["emulate.hardware=h800", "steps=3"]))
    emu = emulator(cfg)
    sim = build(emu.target, "h800", record=False)
    P, G = cfg.rollout.prompts_per_step, cfg.rollout.group_size
    assert emu.length((2 * P + 5) * G + 3) == sim.resp[2][5][3]
    assert emu.limits(1, [4]) == sim.resp[1][4]
    assert all(1 <= emu.real_len(x) <= cfg.rollout.max_new_tokens for x in emu.limits(0, range(P)))


def test_engine_call_takes_the_modelled_time_over_the_compression():
    from relax.emulate.engine import EmulatedEngine
    from relax.engines.feed import fixed
    from relax.models import build_model

    cfg = engine_config(load_config(ASYNC, ["emulate.hardware=h800", "steps=2", "emulate.compression=2000"]))
    emu = Emulator(cfg)
    model, tok = build_model(cfg.model, 0)
    eng = EmulatedEngine(model, tok, emu)
    lengths = emu.limits(0, [0, 1])
    modelled, _ = emu.generate_time(lengths)
    t0 = time.time()
    gens = eng.generate([[1, 5, 6]] * len(lengths), lengths)
    took = time.time() - t0
    assert took >= modelled / 2000  # never faster than the model (slower only by this machine's own overhead)
    assert [len(g.token_ids) for g in gens] == [emu.real_len(x) for x in lengths]
    t0 = time.time()
    streamed = list(eng.generate_stream(fixed([[1, 5, 6]] * len(lengths), lengths), max_inflight=4))
    assert sorted(i for i, _ in streamed) == list(range(len(lengths)))
    # four in flight (max_inflight) takes longer on the model than all sixteen at once, and the stream its time
    four = emu.cost.generate([(emu.prompt, x) for x in lengths], 4)[0]
    assert four > modelled and time.time() - t0 >= four / 2000


@pytest.mark.slow
def test_emulated_h800x16_with_partial_rollout_trains_every_sample_once_with_a_replica_killed(tmp_path):
    """The paper's shape on emulated H800s with streaming that refills and partial rollout (s = 1), one of the 4
    rollout replicas killed mid-run: every sample trained exactly once. A response of up to 20,480 modelled tokens
    outlives the Actor's step, so new versions reach requests in flight and are loaded without restarting them: rows
    record the span, and staleness counts from the first version."""
    from relax.controller import run_experiment

    faults = "faults=[{role: rollout, at_step: 1, kind: kill, replica: 2, after_s: 0.2}]"
    cfg = load_config(ASYNC, ["emulate.hardware=h800", "emulate.compression=200", "steps=4", "max_staleness=1",
                              "rollout.chunk_groups=8", "rollout.max_inflight=64", "rollout.partial=true", faults])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    assert summary["samples_trained"] == 4 * 256
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    e = summary["emulated_hardware"]
    assert e["hardware"] == "h800" and e["gpus"] == {"actor": 8, "rollout": 4, "reference": 2, "actor_fwd": 2}
    assert e["mean_step_time_s"] == pytest.approx(summary["mean_step_time_s"] * 200, rel=1e-3)
    assert summary["emulated"] is False  # the schedule is relax's own (schedule emulation is another flag)
    assert summary["environment"]["hardware"].startswith("EMULATED h800")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["emulated_hardware_s"]["step_time_s"] == pytest.approx(r["step_time_s"] * 200, abs=0.01) for r in rows)
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(r["staleness_max"] <= 1 for r in rows)
    assert max(r["partial_span_max"] for r in rows) >= 1  # some row's tokens came from two versions
    assert 0 < sum(r["partial_rows_share"] for r in rows) / len(rows) < 1
    rec = json.loads((run_dir / "recovery.json").read_text())
    assert [(f["role"], f["kind"]) for f in rec["faults"]] == [("rollout", "kill")]
    # one recovery event for the killed replica; its claims went back to the queue (the other replicas, or its
    # replacement once up, generated those groups: the exactly-once account above)
    events = [ev for ev in rec["events"] if ev["role"] == "rollout"]
    assert len(events) == 1 and events[0]["replica"] == 2 and events[0]["tier"] == 1


def test_modelled_reload_prices_the_weights_and_the_actors_optimizer_state():
    emu = emulator(engine_config(load_config(ASYNC, ["emulate.hardware=h800", "steps=2"])))
    c = emu.cost
    assert emu.reload_time("rollout") == pytest.approx(c.weight_load_time())
    # the Actor's optimizer state (12 bytes per parameter) comes on top of its weights
    assert emu.reload_time("actor") > emu.reload_time("reference") > 0
    assert emu.reload_time("actor") - emu.reload_time("reference") == pytest.approx(
        c.shape.total_params * 12 / (8 * c.hw.links.host.value), rel=1e-6)

