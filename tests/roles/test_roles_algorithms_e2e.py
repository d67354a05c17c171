"""End-to-end runs of the algorithm suite (2 steps each, the small overrides of tests/test_e2e.py):
PPO with a Critic (GAE) + a GenRM judge + DAPO marks in one run, colocated SAPO with a Critic and DAPO redraws,
on-policy distillation with a Teacher, GSPO on ReMax advantages, and capped_pg (the README's worked example: the documented CLI run of
tests/test_e2e.py, 4 steps, shared through tests/conftest.py). Each live run is expensive on 2 cores, so one run
carries several features. Every run checks the exactly-once account and one trace lane per service."""

import json
from pathlib import Path

import pytest

from relax.config import load_config
from relax.controller import run_experiment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SMALL = ["steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=2",
         "warmup.steps=40", "task.eval_size=8", "model.hidden_size=64", "model.intermediate_size=128"]
BASE = {"rollout", "reward", "reference", "advantages", "actor"}


def _run(tmp_path, *overrides):
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [*SMALL, *overrides])
    run_dir, _ = run_experiment(cfg, out=tmp_path, progress=False)
    return _checked(run_dir, cfg.steps)


def _checked(run_dir: Path, steps: int):
    """A finished run's rows, summary, trace lanes and spans, after the account checks."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    trace = json.loads((run_dir / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [r["step"] for r in rows] == list(range(steps))
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    assert summary["samples_trained"] == steps * 16
    return rows, summary, lanes, spans


def test_ppo_with_critic_genrm_and_dynamic_sampling(tmp_path):
    # The untrained judge tends to score a whole group alike, so DAPO may drop every group (the Actor then trains
    # nothing): this run checks the Critic, the GenRM service and the marks, not the policy loss.
    judge = "{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, intermediate_size: 64}"
    rows, summary, lanes, spans = _run(tmp_path, "algorithm.advantage=gae", "task.reward=genrm",
                                       f"genrm.model={judge}", "algorithm.dynamic_sampling.enabled=true")
    assert lanes == BASE - {"reward"} | {"critic", "genrm"}
    trained = [s for s in spans if s["name"] == "critic_train"]
    assert [s["args"]["step"] for s in trained] == [0, 1] and all(s["args"]["rows"] == 16 for s in trained)
    assert all("value_loss" in s["args"] for s in trained)
    for r in rows:  # dropped (degenerate) groups are skipped by the Actor but stay in the account
        assert r["samples"] + r["samples_dropped"] == 16 and r["samples_dropped"] % 4 == 0
        # a GenRM score is not known to the rollout: groups are marked, never redrawn
        assert r["groups_resampled"] == 0 and r["groups_generated"] == 4


def test_colocate_sapo_with_critic_and_dynamic_sampling_refill(tmp_path):
    # Colocate (rollout, critic values, advantages, critic step, actor step in turn) with the rule reward:
    # degenerate groups are redrawn up to max_batches = 3 draws per slot. The loss is SAPO's soft gate.
    rows, summary, lanes, spans = _run(tmp_path, "mode=colocate", "max_staleness=0", "algorithm.advantage=gae",
                                       "algorithm.dynamic_sampling.enabled=true",
                                       "algorithm.dynamic_sampling.max_batches=3", "algorithm.policy_loss=sapo")
    assert all(r["grad_norm"] > 0 for r in rows if r["samples"] > 0) and any(r["samples"] > 0 for r in rows)
    assert lanes == BASE | {"critic"}
    trained = [s for s in spans if s["name"] == "critic_train"]
    assert [s["args"]["step"] for s in trained] == [0, 1] and all(s["args"]["rows"] == 16 for s in trained)
    for r in rows:
        assert r["samples"] + r["samples_dropped"] == 16 and r["groups_dropped"] * 4 == r["samples_dropped"]
        # every redrawn slot took >= 2 draws, every slot still dropped took all 3
        assert 4 + r["groups_resampled"] <= r["groups_generated"] <= 4 + 2 * r["groups_resampled"]
        assert r["groups_dropped"] <= r["groups_resampled"]
        assert r["groups_generated"] >= 4 + 2 * r["groups_dropped"]
    assert sum(r["groups_resampled"] for r in rows) > 0  # the warm-up policy is imperfect: some groups were redrawn


def test_on_policy_distillation(tmp_path):
    rows, summary, lanes, spans = _run(tmp_path, "algorithm.policy_loss=opd",
                                       "algorithm.params={task_reward: false, opd_coef: 1.0}")
    assert lanes == BASE | {"teacher"}
    assert all(r["grad_norm"] > 0 for r in rows)  # the teacher differs from the student: a distillation signal


@pytest.mark.parametrize("loss", ["gspo", "capped_pg"])  # sapo: the colocate run above
def test_policy_losses_run(tmp_path, loss, request):
    if loss == "capped_pg":  # the README's worked example: the shared CLI run (tests/conftest.py) runs that command
        run_dir = request.getfixturevalue("async_cli_run")
        assert load_config(run_dir / "config.yaml").algorithm.policy_loss == "capped_pg"
        rows, summary, lanes, _ = _checked(run_dir, 4)
    else:  # GSPO's loss on ReMax advantages: the Rollout's greedy baseline reaches Advantages through the bus
        rows, summary, lanes, spans = _run(tmp_path, f"algorithm.policy_loss={loss}", "algorithm.advantage=remax")
        advantages = [s for s in spans if s["name"] == "advantages"]
        assert advantages and all("baseline_rewards" in s["args"]["fields"] for s in advantages)
        # field-level storage: the baseline goes only to the task that declared it
        assert all("baseline_rewards" not in s["args"]["fields"] for s in spans if s["name"] == "reward")
    assert lanes == BASE and all(r["samples"] == 16 for r in rows)
