"""A real run with every metrics sink on: each sink gets every step while the run goes on, the events (an
injected kill and its recovery) reach them, a sink that breaks mid-run is dropped once and the run finishes,
and the live /metrics page exports every name the Grafana dashboard queries."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from relax.config import load_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=2", "warmup.steps=40",
         "task.eval_size=16", "model.hidden_size=64", "model.intermediate_size=128"]
STEPS = 3


class BreaksAtStep1:
    """A sink whose disk fills up at step 1."""

    def step(self, step, metrics):
        if step == 1:
            raise OSError(28, "No space left on device")

    def event(self, kind, payload):
        pass

    def close(self):
        pass


def _scrape(run_dir: Path, stop: threading.Event, pages: list[str]) -> None:
    """Keep the newest /metrics page taken after the first step, until the run ends."""
    while not stop.wait(0.2):
        try:
            info = json.loads((run_dir / "api.json").read_text())
            token = (run_dir / "api_token").read_text().strip()
            text = httpx.get(f"{info['url']}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
        except (OSError, ValueError, httpx.HTTPError):
            continue
        if "relax_steps_done 0.0" not in text and "relax_steps_done" in text:
            pages.append(text)


def test_every_sink_gets_every_step_and_the_events_and_a_broken_one_is_dropped(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import relax.controller
    from relax.api.prometheus import dashboard_metric_names, exported_names
    from relax.controller import run_experiment
    from relax.metrics.sinks import build_reporter
    from relax.run_folder import RunFolder

    def with_broken(cfg, folder):
        reporter = build_reporter(cfg, folder)
        reporter.sinks["broken"] = BreaksAtStep1()
        return reporter

    monkeypatch.setattr(relax.controller, "build_reporter", with_broken)
    cfg = load_config(ROOT / "experiments/async/cpu.yaml",
                      [f"steps={STEPS}", *SMALL, "metrics.sinks=[jsonl,tensorboard,wandb,mlflow]",
                       "faults=[{role: reward, at_step: 1, kind: kill}]"])
    run_dir = tmp_path / "async" / "cpu" / "live"
    stop, pages = threading.Event(), []
    scraper = threading.Thread(target=_scrape, args=(run_dir, stop, pages), daemon=True)
    scraper.start()
    try:
        _, summary = run_experiment(cfg, out=tmp_path, run="live", progress=False, api_port=0)
    finally:
        stop.set()
        scraper.join(10)
    folder = RunFolder(run_dir)

    # The run went on past the broken sink, and says which one failed.
    assert summary["steps"] == STEPS and summary["samples_lost"] == 0
    assert summary["metrics_sinks"] == ["jsonl", "tensorboard", "wandb", "mlflow"]
    assert summary["metrics_sinks_failed"] == {"broken": "OSError: [Errno 28] No space left on device"}

    rows = folder.metrics()
    roles = set(rows[0]["busy_s"])
    assert [r["step"] for r in rows] == list(range(STEPS)) and set(rows[0]["busy_share"]) == roles
    events = folder.events()
    kinds = [e["event"] for e in events]
    assert kinds.count("fault") == 1 and kinds.count("recovery") == 1
    recovery = next(e for e in events if e["event"] == "recovery")
    assert recovery["role"] == "reward" and recovery["tier"] == 1 and recovery["ready_s"] > 0

    acc = EventAccumulator(str(folder.sink_dir("tensorboard")))
    acc.Reload()
    for name in ("reward_mean", "loss", "tokens", "staleness_mean", "trainer_wait_s", "weight_sync_s",
                 *(f"busy_share/{r}" for r in roles)):
        assert [e.step for e in acc.Scalars(name)] == list(range(STEPS)), name
    assert acc.Scalars("events/recovery_total")[-1].value == 1 and acc.Scalars("events/fault_total")[-1].value == 1

    (run_file,) = folder.sink_dir("wandb").glob("offline-run-*/run-*.wandb")
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                         capture_output=True, text=True, timeout=120)
    history = [json.loads(line)["history"]["item"] for line in out.stdout.splitlines() if '"type":"history"' in line]
    assert [h["_step"] for h in history] == list(range(STEPS))
    assert [h["reward_mean"] for h in history] == [r["reward_mean"] for r in rows]

    client = MlflowClient(tracking_uri=folder.sink_dir("mlflow").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.name).experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward_mean")] == list(range(STEPS))
    assert run.data.metrics["events/recovery_total"] == 1

    # The live page (taken after a step finished) exports every name the dashboard queries.
    assert pages, "no /metrics page was taken during the run"
    live = exported_names(pages[-1])
    assert dashboard_metric_names() <= live, dashboard_metric_names() - live
