"""End-to-end runs: every role as a Ray actor in its own process, joined by the TransferQueue bus.

Small but real: a tiny Qwen3, a short cached warm-up, a few RL steps per mode. Each run starts its own
local Ray (own temp dir) and shuts it down.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from relax.config import load_config
from relax.controller import run_experiment
from relax.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=2", "warmup.steps=40",
         "task.eval_size=16", "model.hidden_size=64", "model.intermediate_size=128"]
STEP_FIELDS = {"step", "wall_time_s", "step_time_s", "reward_mean", "samples", "tokens", "staleness_mean",
               "staleness_max", "trainer_wait_s", "weight_sync_s", "weight_version", "busy_s", "cpu_s"}
SUMMARY_FIELDS = {"steps_per_hour", "tokens_per_s", "final_reward", "initial_reward", "environment",
                  "pipeline_efficiency", "trainer_wait_share", "peak_memory_mb", "samples_lost",
                  "samples_duplicated", "eval_accuracy_start", "eval_accuracy_end", "cpu_per_step_s", "host_cpu_cores",
                  "cpu_by_process_per_step_s", "bus_calls_per_step"}


def _read(run_dir: Path):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, json.loads((run_dir / "summary.json").read_text()), json.loads((run_dir / "trace.json").read_text())


def _check_run(run_dir: Path, steps: int, max_staleness: int, roles: set[str], per_step: int = 16):
    rows, summary, trace = _read(run_dir)
    assert [r["step"] for r in rows] == list(range(steps))
    for r in rows:
        assert STEP_FIELDS <= set(r), STEP_FIELDS - set(r)
        assert set(r["busy_s"]) == roles and set(r["cpu_s"]) == roles
        assert 0 <= r["staleness_max"] <= max_staleness
        assert r["weight_version"] == r["step"] + 1
        assert r["samples"] == per_step
    assert SUMMARY_FIELDS <= set(summary), SUMMARY_FIELDS - set(summary)
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    assert summary["samples_trained"] == steps * per_step
    assert summary["cpu_per_step_s"]["actor"] > 0  # training is CPU work on this machine
    assert 0 < summary["host_cpu_cores"] <= summary["environment"]["cpus"]
    assert summary["environment"]["torch_cpu_capability"]  # e.g. "AVX512": which kernels ran
    # By process: the driver, the Actor's process under its Ray title, the bus's own processes
    by_process = summary["cpu_by_process_per_step_s"]
    assert {"driver", "ray::ActorRole", "ray::TransferQueueController"} <= set(by_process), by_process
    assert by_process["ray::ActorRole"] >= summary["cpu_per_step_s"]["actor"] * 0.9  # its spans are inside it
    # The bus operations behind them, per process: every batch a stage takes it writes back, once
    calls = summary["bus_calls_per_step"]
    assert {"driver", "actor", "rollout-0"} <= set(calls), calls
    assert calls["actor"]["fetch"] >= 1 and sum(c.get("put", 0) for p, c in calls.items() if p.startswith("rollout"))
    assert calls["reward"]["write"] == calls["reward"]["fetch"] > 0, calls["reward"]
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert lanes == roles  # one lane per role in the Chrome trace
    assert (run_dir / "config.yaml").exists()
    return rows, summary


ROLES = {"rollout", "reward", "reference", "advantages", "actor"}


def test_async_off_policy_cli_run(async_cli_run):
    """The documented command: relax run experiments/async/cpu.yaml --steps N --out DIR (here the README's worked
    example, algorithm.policy_loss=capped_pg; the run, tests/conftest.py, is shared with
    tests/roles/test_roles_algorithms_e2e.py)."""
    rows, summary = _check_run(async_cli_run, 4, 1, ROLES)
    assert summary["mode"] == "async" and summary["staleness_max"] <= 1


def test_async_torch_http_engine_cli_run(torch_http_run):
    """rollout.engine=torch_http: the Rollout replica launches the torch engine HTTP server and generates through
    the SGLang client (relax/engines/remote.py); the Actor's published versions reach the server (each row's
    weight_version is the one the server reports, and the on-time staleness bound holds only if they advance).
    The 6-step run (tests/conftest.py; its server is killed once and restarted) is shared with
    tests/test_cluster_network.py and tests/engines/test_remote_engine.py."""
    assert torch_http_run.returncode == 0, torch_http_run.log[-3000:]
    rows, summary = _check_run(torch_http_run.run_dir, 6, 1, ROLES)
    assert summary["backends"]["rollout"] == "torch_http engine"
    # staleness = step - row weight_version: rows of step 5 came from server version >= 4 (it started at 0)
    assert rows[-1]["staleness_max"] <= 1 and rows[-1]["step"] == 5


@pytest.fixture(scope="module")
def onpolicy_run(tmp_path_factory):
    """One on-policy run (experiments/async/cpu-onpolicy.yaml) read by two tests: it is never stale, and GRPO raises
    the reward on basic_arithmetic from the warm-up start (seeded, 16 steps). The rollout cycles through a pool of
    16 prompts, so the improvement is visible within the step budget; the warm-up saw the whole task and starts at
    ~0.5 sampled reward on the pool."""
    cfg = load_config(ROOT / "experiments/async/cpu-onpolicy.yaml",
                      ["steps=16", "task.rl_pool=16", "training.lr=0.0001", "task.eval_size=16", "task.eval_every=5"])
    run_dir, _ = run_experiment(cfg, out=tmp_path_factory.mktemp("onpolicy"), progress=False)
    return run_dir


def test_async_on_policy_never_stale(onpolicy_run):
    rows, _ = _check_run(onpolicy_run, 16, 0, ROLES, per_step=16 * 8)
    assert all(r["staleness_mean"] == 0 for r in rows)


def test_the_eval_curve_evaluates_every_kept_version_after_the_run(onpolicy_run):
    """task.eval_every=5: the driver kept one version in each window of 5 (the one due, or a newer one when the
    holders had moved on) and the curve runs from the warm-up start to the final weights on the run's clock."""
    summary = json.loads((onpolicy_run / "summary.json").read_text())
    curve = summary["eval_curve"]
    versions = [p["version"] for p in curve]
    assert versions[0] == 0 and versions[-1] == 16 and len(versions) == 5, curve
    assert all(5 * i <= v < 5 * (i + 1) for i, v in enumerate(versions[1:-1], start=1)), curve
    kept = RunFolder(onpolicy_run).snapshots()
    assert list(kept) == versions[1:-1] and all(p.parent.name == "snapshots" for p in kept.values())
    assert curve[0]["accuracy"] == round(summary["eval_accuracy_start"], 4)
    assert curve[-1]["accuracy"] == round(summary["eval_accuracy_end"], 4)
    walls = [p["wall_time_s"] for p in curve]
    assert walls[0] == 0 and walls == sorted(walls) and abs(walls[-1] - summary["train_time_s"]) < 0.01, curve
    assert all(0 <= p["accuracy"] <= 1 for p in curve)


def _sums_parquet(path: Path, n: int, bad_row: int | None = None) -> Path:
    """A researcher's own parquet file: `question` text and a nested `label.value` answer."""
    import datasets

    rows = [{"question": f"{i % 10}+{i // 10}=", "label": {"value": str(i % 10 + i // 10)}} for i in range(n)]
    if bad_row is not None:
        rows[bad_row]["label"]["value"] = None
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


def _colocate_parquet_run(data: Path, out: Path) -> subprocess.CompletedProcess:
    task = ["task.name=local_dataset", "task.reward=exact", "task.prompt_template='{question}'",
            f"task.params={{path: {data}, prompt: question, answer: label.value}}", "task.size=84"]
    cmd = [sys.executable, "-m", "relax.cli", "run", "experiments/colocate/cpu.yaml", "--steps", "3", "--out",
           str(out), "--no-progress", *SMALL, *task, "rollout.replicas=2"]  # the colocate loop drives both engines
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def colocate_run(tmp_path_factory):
    """One colocated CLI run on a parquet file (task.name=local_dataset), read by two tests: the engine sleeps and
    wakes around training, and the run reads the researcher's rows."""
    tmp = tmp_path_factory.mktemp("colocate")
    data = _sums_parquet(tmp / "sums.parquet", 100)
    proc = _colocate_parquet_run(data, tmp / "results")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list((tmp / "results" / "colocate" / "cpu").iterdir())
    return data, run_dir


def test_colocate_sleeps_and_wakes_the_engine(colocate_run):
    _, run_dir = colocate_run
    rows, summary = _check_run(run_dir, 3, 0, ROLES)
    assert all(r["sleep_wake_s"] > 0 and r["freed_bytes"] > 0 for r in rows)
    assert summary["sleep_wake_s_mean"] > 0
    # colocated: rollout and training alternate, so generation never overlaps a training micro-batch
    _, _, trace = _read(run_dir)
    lane = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["ph"] == "M"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    gen_spans = [e for e in spans if e["tid"] == lane["rollout"] and e["name"] == "generate"]
    gen = [(e["ts"], e["ts"] + e["dur"]) for e in gen_spans]
    train = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == lane["actor"] and e["name"] == "train_micro_batch"]
    assert gen and train
    # rollout.replicas=2: both engines generate every step, each its half of the partition's groups
    for k in range(3):
        groups = {r: sum(e["args"]["groups"] for e in gen_spans if e["args"]["step"] == k
                         and e["args"].get("replica") == r) for r in (0, 1)}
        assert groups[0] > 0 and groups[1] > 0 and sum(groups.values()) == 4, (k, groups)
    assert not any(a0 < b1 and b0 < a1 for a0, a1 in gen for b0, b1 in train)


def test_colocate_run_on_a_parquet_file(colocate_run, tmp_path):
    """task.name=local_dataset: the warm-up, rollout, reward and evaluation all read the parquet rows through
    the column mapping; a bad row fails the same command before anything starts."""
    data, run_dir = colocate_run
    _check_run(run_dir, 3, 0, ROLES)
    assert load_config(run_dir / "config.yaml").task.params["path"] == str(data)
    proc = _colocate_parquet_run(_sums_parquet(tmp_path / "bad.parquet", 100, bad_row=57), tmp_path / "bad")
    assert proc.returncode == 2 and "task.params.answer: bad.parquet row 57 column 'label.value'" in proc.stderr
    assert not (tmp_path / "bad").exists()  # nothing half-written, Ray never started


def test_bad_config_fails_before_anything_starts(tmp_path):
    cmd = [sys.executable, "-m", "relax.cli", "run", "experiments/async/cpu.yaml", "--out", str(tmp_path),
           "rollout.group_size=1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "rollout.group_size" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_reward_rises_from_warmup_start(onpolicy_run):
    """GRPO raises the reward on basic_arithmetic from the warm-up start (the on-policy run above)."""
    rewards = [r["reward_mean"] for r in _read(onpolicy_run)[0]]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.05, rewards
