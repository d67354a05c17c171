"""The simulator's pieces the study uses (relax/sim/): the split search, the pool limits, the layout's collectives,
what the work implies, and the simulator-side streaming of groups."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, load_config
from relax.sim.bound import pool_limits
from relax.sim.cost import CostModel, SimOptions
from relax.sim.hardware import HardwareProfile, load_hardware
from relax.sim.lengths import LengthModel
from relax.sim.output import mean_step_time, steady_step_time
from relax.sim.search import search_split, split_candidates, with_split
from relax.sim.shapes import model_shape
from relax.sim.sim import Simulation
from tests.sim.test_sim import _cfg, _free_profile

ASYNC16 = "experiments/async/h800x16.yaml"


def _h800_sim(cfg, steps=3, mean=2000.0, cv=0.7, **opts) -> Simulation:
    cfg = cfg.model_copy(update={"steps": steps})
    lm = LengthModel(prompt_tokens=150, max_new_tokens=cfg.rollout.max_new_tokens, mean=mean, cv=cv, source="test")
    return Simulation(cfg, CostModel(cfg, model_shape(cfg), load_hardware("h800"), SimOptions(**opts)), lm)


# --- split search -------------------------------------------------------------------------------------------
def test_split_candidates_keep_the_cluster_and_the_layout():
    cfg = load_config(ASYNC16)
    free = cfg.resources.rollout.gpus + cfg.resources.actor.gpus
    cands = split_candidates(cfg)
    assert (4, 8) in cands  # the config's own split
    for rollout, actor in cands:
        assert rollout + actor == free and actor % 2 == 0 and rollout >= 1  # TP 2 trainer, 1-GPU replicas
        c = with_split(cfg, rollout, actor)
        assert c.rollout.replicas == rollout and c.resources.actor.gpus == actor


def test_split_search_returns_the_argmin_over_the_candidates():
    cfg = load_config(ASYNC16)
    times = {}

    def simulate(c):
        t = mean_step_time(_h800_sim(c, **{"inflight_groups": 8}).run())
        times[(int(c.resources.rollout.gpus), int(c.resources.actor.gpus))] = t
        return t

    res = search_split(cfg, simulate)
    assert len(res["candidates"]) == len(split_candidates(cfg)) == len(times)
    best = min(times, key=times.get)
    assert (res["best"]["rollout_gpus"], res["best"]["actor_gpus"]) == best
    assert res["best"]["step_time_s"] == min(times.values())


def test_split_search_names_the_field_when_nothing_fits():
    with pytest.raises(ConfigError, match="mode"):
        split_candidates(load_config("experiments/colocate/h800x16.yaml"))

    def never(c):
        raise ConfigError("resources.rollout.gpus: too small")

    with pytest.raises(ConfigError, match="no candidate split"):
        search_split(load_config(ASYNC16), never)


# --- what the work implies ------------------------------------------------------------------------------------
def test_effective_mfu_is_the_assumed_one_when_nothing_else_costs():
    """TP 1, PP 1, no recompute, no fixed costs: the training seconds are the FLOPs at the assumed MFU exactly;
    full recompute does 4 passes for the 3 the MFU counts."""
    hw = HardwareProfile.model_validate(_free_profile(train_mfu=0.3))
    cfg = _cfg()
    for recompute, expected in ((False, 0.3), (True, 0.3 * 3 / 4)):
        cost = CostModel(cfg, model_shape(cfg), hw, SimOptions(recompute=recompute))
        cost.train_time(1000.0, 5e4)
        cost.train_time(300.0, 1e4)
        assert cost.implied()["effective_train_mfu"] == pytest.approx(expected, rel=1e-3)


def test_layout_collectives_cost_only_with_model_parallelism():
    hw = load_hardware("h800")
    base = load_config(ASYNC16)
    tp1 = base.model_copy(update={"training": base.training.model_copy(update={
        "parallel": base.training.parallel.model_copy(update={"tensor": 1, "sequence_parallel": False})})})
    c1, c2 = CostModel(tp1, model_shape(tp1), hw), CostModel(base, model_shape(base), hw)
    assert c1.layout_comm_time(1e5, 3.0, "actor") == 0.0
    t = c2.layout_comm_time(1e5, 3.0, "actor")
    assert t > 0
    # volume scales with tokens; the fixed latency part does not
    assert c2.layout_comm_time(2e5, 3.0, "actor") - t == pytest.approx(t - c2.layout_comm_time(0.0, 3.0, "actor"))


# --- pool limits and streaming ----------------------------------------------------------------------------
def test_trainer_limit_is_below_every_simulated_async_step():
    """The Actor trains every sequence of a step whatever the schedule: its limit (one pass over them, no waits)
    cannot exceed a steady step."""
    cfg = load_config(ASYNC16, ["max_staleness=1"])
    sim = _h800_sim(cfg, steps=4, mean=800.0, inflight_groups=8).run()
    lim = pool_limits(sim)
    ends = [sim.step_end[k] for k in range(sim.steps)]
    for a, b in zip(ends, ends[1:]):
        assert b - a >= lim["limits_s"]["actor"] * (1 - 1e-9)
    assert lim["bound_step_s"] == max(lim["limits_s"].values())


def test_streamed_groups_reach_the_trainer_before_the_call_ends():
    """One engine call per replica: without streaming the trainer starts after the call; with it, the first group
    that finishes is trained while the engine still decodes the rest."""
    cfg = load_config(ASYNC16, ["max_staleness=0"])
    first = {}
    for stream in (False, True):
        sim = _h800_sim(cfg, steps=2, inflight_groups=8, stream_groups=stream).run()
        gen_end = min(s.end for s in sim.spans if s.name == "generate" and s.step == 0)
        train0 = min(s.start for s in sim.spans if s.name == "train_micro_batch" and s.step == 0)
        first[stream] = (train0, gen_end)
    assert first[False][0] >= first[False][1]
    assert first[True][0] < first[True][1]


def test_rollout_max_inflight_streams_and_caps_the_engine_as_the_engine_does():
    """The config's request-level streaming is the simulator's too: groups land as they finish (the trainer starts
    on partition 0 before its last claim is done), and a smaller max_inflight admits fewer requests at once, so
    the same partition takes longer."""
    gen = {}
    for cap in (256, 8):
        cfg = load_config(ASYNC16, ["max_staleness=0", f"rollout.max_inflight={cap}"])
        sim = _h800_sim(cfg, steps=2, inflight_groups=8).run()
        gen[cap] = max(s.end for s in sim.spans if s.name == "generate" and s.step == 0)
        assert min(s.start for s in sim.spans if s.name == "train_micro_batch" and s.step == 0) < gen[cap]
    assert gen[8] > gen[256]


def test_partial_rollout_loads_a_new_version_mid_call_and_keeps_the_first_for_the_bound():
    """rollout.partial: a version published while a call decodes is loaded in it (a pause, not a restart); the
    groups of that call keep the version they started with, the one max_staleness bounds."""
    calls = {}
    for partial in (False, True):
        cfg = load_config(ASYNC16, ["max_staleness=2", "rollout.max_inflight=256", f"rollout.partial={partial}"])
        sim = _h800_sim(cfg, steps=4, inflight_groups=32).run()
        mid = [s for s in sim.spans if s.name == "weight_sync" and s.args.get("partial")]
        calls[partial] = mid
        if partial:
            assert mid, "no version arrived mid-call: the test shape needs a longer call"
            for s in mid:  # loaded inside a generate call of the same replica, not between calls
                assert any(g.name == "generate" and g.args["replica"] == s.args["replica"]
                           and g.start < s.start and s.end <= g.end for g in sim.spans)
        for k in range(sim.steps):
            assert all(k - v <= 2 for v in sim.group_version[k])  # the bound holds on the first version
    assert not calls[False]


@pytest.mark.parametrize("s", [0, 1, 2])
def test_no_async_step_beats_the_staleness_latency_floor(s):
    """Partition k + s + 1 starts only once k is trained, and k is not trained before its longest response is
    decoded and the Actor has trained it: the steady step is never below (L + T) / (s + 1) (relax/sim/bound.py),
    with the engine refilled (streaming + partial rollout) or not."""
    for extra in ([], ["rollout.max_inflight=64", "rollout.partial=true"]):
        if s == 0 and extra:
            extra = ["rollout.max_inflight=64"]  # partial rollout needs s >= 1
        cfg = load_config(ASYNC16, [f"max_staleness={s}", *extra])
        sim = _h800_sim(cfg, steps=12, mean=3000.0, inflight_groups=8).run()
        skip = s + 1
        lim = pool_limits(sim, range(skip, sim.steps))
        assert steady_step_time(sim) >= lim["latency_floor_s"] * 0.98
        assert lim["floor_step_s"] == max(lim["bound_step_s"], lim["latency_floor_s"])
        # the tail shares its engine's batch: at one batch size for all, the best step is above both limits
        assert lim["tradeoff_step_s"] >= lim["floor_step_s"] and 1 <= lim["tradeoff_batch"] <= lim["rollout_best_batch"]


def test_the_tradeoff_picks_a_smaller_batch_only_while_latency_binds():
    """relax/sim/bound.py's tradeoff: at s = 1 the 20,480-token tail binds, so the best uniform batch is below the
    rollout's best and the step above its bound; more staleness spreads the tail's latency over more steps, so the
    best batch grows and the step falls towards the bound."""
    out = {}
    for s in (1, 2, 8):
        cfg = load_config(ASYNC16, [f"max_staleness={s}", "rollout.max_inflight=64", "rollout.partial=true"])
        out[s] = pool_limits(_h800_sim(cfg, steps=4, mean=3000.0, inflight_groups=8))
    assert out[1]["tradeoff_batch"] < out[1]["rollout_best_batch"]
    assert out[1]["tradeoff_step_s"] > out[1]["bound_step_s"]
    assert out[1]["tradeoff_step_s"] > out[2]["tradeoff_step_s"] > out[8]["tradeoff_step_s"] >= out[8]["bound_step_s"]
    assert out[1]["tradeoff_batch"] < out[2]["tradeoff_batch"] < out[8]["tradeoff_batch"]


def test_steady_step_time_skips_the_partitions_the_gate_admits_at_once():
    class Fake:  # step ends of a run at s = 2: partitions 0..2 started together, then one every 10 s
        steps, step_end = 5, {0: 10.0, 1: 12.0, 2: 14.0, 3: 24.0, 4: 34.0}
        cfg = load_config(ASYNC16, ["max_staleness=2"])

    assert steady_step_time(Fake) == 10.0
    assert mean_step_time(Fake) == 6.0  # the fill's head start, counted as speed
