"""The metrics sinks (relax/metrics/): each one's output read back with its own tool, and a failing sink is
reported once and dropped while the others go on."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from relax.config import ConfigError, load_config
from relax.metrics.sinks import Reporter, build_reporter, scalars
from relax.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _config(*sinks: str):
    return load_config(ROOT / "experiments/async/cpu.yaml", [f"metrics.sinks=[{','.join(['jsonl', *sinks])}]"])


def _row(k: int) -> dict:
    """A step's metrics as the controller hands them (a metrics.jsonl row less `step`)."""
    return {"wall_time_s": 1.5 * (k + 1), "step_time_s": 1.5, "reward_mean": 0.25 * k, "loss": -0.1 * k,
            "grad_norm": 0.5, "tokens": 100 + k, "staleness_mean": 0.5, "trainer_wait_s": 0.2, "weight_sync_s": 0.01,
            "busy_s": {"rollout": 1.2, "actor": 0.6}, "busy_share": {"rollout": 0.8, "actor": 0.4}}


def _feed(reporter: Reporter) -> None:
    for k in range(STEPS):
        reporter.step(k, _row(k))
        if k == 1:
            reporter.event("recovery", {"role": "reward", "tier": 1, "ready_s": 2.5, "steps_done": 2})
    reporter.close()


def _folder(tmp_path, name="run") -> RunFolder:
    return RunFolder.create(tmp_path, "async", "cpu", name)


def test_scalars_flatten_per_role_values_and_keep_nan():
    got = dict(scalars({"loss": math.nan, "busy_share": {"rollout": 0.5}, "note": "x", "ids": [1], "none": None,
                        "tokens": 7}))
    assert math.isnan(got.pop("loss"))
    assert got == {"busy_share/rollout": 0.5, "tokens": 7.0}


def test_jsonl_appends_each_step_and_event_live(tmp_path):
    folder = _folder(tmp_path)
    reporter = build_reporter(_config(), folder)
    reporter.step(0, _row(0))
    assert folder.metrics() == [{"step": 0, **_row(0)}]  # readable while the run goes on
    reporter.event("fault", {"role": "reward", "kind": "kill"})
    reporter.step(1, _row(1))
    reporter.close()
    assert [r["step"] for r in folder.metrics()] == [0, 1]
    assert folder.events() == [{"event": "fault", "role": "reward", "kind": "kill"}]  # the payload's own kind kept
    assert reporter.failed == {}


def test_a_row_being_written_is_skipped_by_the_reader(tmp_path):
    folder = _folder(tmp_path)
    folder.append_metrics({"step": 0})
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "rew')  # a live writer halfway through a line
    assert folder.metrics() == [{"step": 0}]


def test_tensorboard_event_file_reads_back_with_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = _folder(tmp_path)
    reporter = build_reporter(_config("tensorboard"), folder)
    _feed(reporter)
    assert reporter.failed == {}
    acc = EventAccumulator(str(folder.sink_dir("tensorboard")))
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("reward_mean")] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [e.step for e in acc.Scalars("busy_share/rollout")] == [0, 1, 2]
    assert {"loss", "grad_norm", "tokens", "staleness_mean", "trainer_wait_s", "weight_sync_s",
            "busy_s/actor"} <= set(acc.Tags()["scalars"])
    assert [e.value for e in acc.Scalars("events/recovery_total")] == [1.0]
    text = acc.Tensors("events/recovery/text_summary")[0]
    assert json.loads(text.tensor_proto.string_val[0])["role"] == "reward"


def test_wandb_offline_run_holds_the_history(tmp_path):
    folder = _folder(tmp_path)
    reporter = build_reporter(_config("wandb"), folder)
    _feed(reporter)
    assert reporter.failed == {}
    (run_file,) = folder.sink_dir("wandb").glob("offline-run-*/run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["_step"] for h in history] == [0, 1, 2]
    assert [h["reward_mean"] for h in history] == [0.0, 0.25, 0.5]
    assert history[0]["busy_share/rollout"] == 0.8
    assert history[2]["events/recovery_total"] == 1  # the event, counted with the next step
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["project"] == "async" and run["display_name"] == "run"


def test_mlflow_file_store_reads_back_with_the_mlflow_client(tmp_path):
    from mlflow.tracking import MlflowClient

    folder = _folder(tmp_path)
    reporter = build_reporter(_config("mlflow"), folder)
    _feed(reporter)
    assert reporter.failed == {}
    client = MlflowClient(tracking_uri=folder.sink_dir("mlflow").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("async").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "busy_share/actor")] == [0, 1, 2]
    assert run.data.metrics["events/recovery_total"] == 1
    events = [a.path for a in client.list_artifacts(run.info.run_id, "events")]
    assert events == ["events/0001-recovery.json"]


def test_a_sink_that_cannot_start_is_dropped_once_and_the_others_go_on(tmp_path, capsys):
    folder = _folder(tmp_path)
    folder.sink_dir("tensorboard").write_text("a file where the sink's folder should be")
    reporter = build_reporter(_config("tensorboard"), folder)
    _feed(reporter)
    assert set(reporter.failed) == {"tensorboard"}
    assert capsys.readouterr().err.count("metrics sink 'tensorboard' failed") == 1
    assert [r["step"] for r in folder.metrics()] == [0, 1, 2]  # jsonl got every step


class Broken:
    """A sink whose write fails from its second step on (a disk that filled up)."""

    def __init__(self):
        self.steps = []

    def step(self, step, metrics):
        if self.steps:
            raise OSError(28, "No space left on device")
        self.steps.append(step)

    def event(self, kind, payload):
        pass

    def close(self):
        raise AssertionError("a dropped sink is not called again")


class Recording:
    def __init__(self):
        self.steps, self.events, self.closed = [], [], 0

    def step(self, step, metrics):
        self.steps.append(step)

    def event(self, kind, payload):
        self.events.append(kind)

    def close(self):
        self.closed += 1


def test_a_sink_whose_write_raises_is_reported_once_and_dropped(capsys):
    broken, ok = Broken(), Recording()
    reporter = Reporter({"broken": broken, "ok": ok})
    _feed(reporter)
    reporter.close()  # a second close (the controller's finally) does nothing
    assert broken.steps == [0]
    assert ok.steps == [0, 1, 2] and ok.events == ["recovery"] and ok.closed == 1
    assert reporter.failed == {"broken": "OSError: [Errno 28] No space left on device"}
    assert capsys.readouterr().err.count("metrics sink 'broken' failed") == 1


def test_sinks_config_must_keep_jsonl_and_name_each_once():
    with pytest.raises(ConfigError, match=r"metrics\.sinks: .*must include jsonl"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["metrics.sinks=[tensorboard]"])
    with pytest.raises(ConfigError, match=r"metrics\.sinks: .*tensorboard listed more than once"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["metrics.sinks=[jsonl,tensorboard,tensorboard]"])
    with pytest.raises(ConfigError, match=r"metrics\.sinks\.1"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["metrics.sinks=[jsonl,clearml]"])


def test_preflight_names_metrics_sinks_when_a_sink_package_is_missing(monkeypatch):
    import importlib.util

    from relax.preflight import _check_sinks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    _check_sinks(_config("tensorboard"))  # installed: passes
    with pytest.raises(ConfigError, match=r"metrics\.sinks: the wandb sink needs the 'wandb' package"):
        _check_sinks(_config("tensorboard", "wandb"))
