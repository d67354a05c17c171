"""ActorFwd (algorithm.old_log_probs: actor_fwd): the trainer's forward recomputes old log-probs on its own
service, at the weight version that generated each row."""

from pathlib import Path

import pytest
from test_roles_algorithms_e2e import _run as run_small  # the same small 2-step run and its account checks

from relax.config import load_config
from relax.roles.registry import role_order

ROOT = Path(__file__).resolve().parents[2]
FWD = ["algorithm.old_log_probs=actor_fwd", "rollout.dtype=bfloat16"]  # a bf16 engine: a mismatch to take out


def test_actor_fwd_runs_between_rollout_and_actor_and_only_when_asked():
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", ["algorithm.old_log_probs=actor_fwd"])
    order = role_order(cfg)
    assert order.index("rollout") < order.index("actor_fwd") < order.index("actor")
    assert "actor_fwd" not in role_order(load_config(ROOT / "experiments/async/cpu.yaml"))


def test_emulated_schedules_refuse_actor_fwd():
    with pytest.raises(ValueError, match="algorithm.old_log_probs"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["algorithm.old_log_probs=actor_fwd", "schedule=verl"])


def _run(tmp_path, *overrides):
    rows, _, lanes, _ = run_small(tmp_path, *FWD, *overrides)
    return rows, lanes


@pytest.mark.slow
def test_colocate_ratio_is_one_with_the_trainers_old_log_probs(tmp_path):
    # On-policy, one optimizer step per partition: the trainer's own forward gives ratio 1 on every token,
    # while the bf16 engine's log-probs differ from the trainer's (the mismatch ActorFwd takes out of the ratio).
    rows, lanes = _run(tmp_path, "mode=colocate", "max_staleness=0")
    assert "actor_fwd" in lanes
    for r in rows:
        assert r["old_log_probs_exact_share"] == 1.0
        assert r["clip_frac"] == 0.0 and abs(r["approx_kl"]) < 1e-6
        assert r["old_rollout_gap_abs"] > 1e-3


@pytest.mark.slow
def test_async_actor_fwd_uses_each_rows_generating_version(tmp_path):
    rows, lanes = _run(tmp_path, "max_staleness=1")
    assert "actor_fwd" in lanes
    assert all(r["old_log_probs_exact_share"] == 1.0 for r in rows)
    # Step 1's rows came from version 0 (the Rollout starts partition 1 as soon as partition 0 is on the bus, long
    # before the Actor can publish version 1), so "exact" means an older version than the newest, not version 0
    # for everything.
    assert [r["staleness_max"] for r in rows] == [0, 1]
