"""A run's status (relax/metrics/status.py) and `relax status`: from a finished run's result files, and from the
live status.json the controller writes while a run goes on."""

from __future__ import annotations

import json
import math
from pathlib import Path

from relax.cli import main
from relax.metrics.status import make_status, read_status
from relax.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[2]
FINISHED = ROOT / "results/reference/recovery/runs/async/cpu-recovery-cold/cold"  # a committed run, one kill


def strict(text: str):
    def refuse(c):
        raise AssertionError(f"{c} in status JSON (a browser cannot parse it)")
    return json.loads(text, parse_constant=refuse)


def test_a_finished_run_is_summarised_from_its_result_files(capsys):
    folder = RunFolder(FINISHED)
    s = read_status(FINISHED)
    rows = folder.metrics()
    assert s["state"] == "finished" and s["steps_done"] == folder.summary()["steps"] == len(rows)
    assert s["reward"] == [[r["step"], r["reward_mean"]] for r in rows]
    assert s["busy_share"] == folder.summary()["busy_share"]
    assert [e["role"] for e in s["recoveries"]] == ["rollout"] and s["recoveries"][0]["tier"] == 1
    assert s["faults"][0]["kind"] == "kill"
    assert main(["status", str(FINISHED)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and f"{len(rows)} / {s['steps_total']} steps" in out
    for role in ("rollout", "reward", "reference", "advantages", "actor"):
        assert role in out
    assert "recoveries" in out and "live view" not in out  # its API is gone
    assert main(["status", str(FINISHED), "--json"]) == 0
    assert strict(capsys.readouterr().out) == s


def test_a_live_run_is_read_from_status_json(tmp_path, capsys):
    folder = RunFolder.create(tmp_path, "async", "cpu", "live")
    rows = [{"step": 0, "reward_mean": 0.25, "loss": 0.1, "tokens": 300, "step_time_s": 2.0},
            {"step": 1, "reward_mean": 0.5, "loss": math.nan, "tokens": 310, "step_time_s": 1.5}]
    alert = {"rule": "non_finite", "state": "firing", "message": "non-finite loss=nan at step 1", "step": 2,
             "run": "async/live", "time": 0.0}
    folder.write_status(make_status(folder, {"name": "async", "mode": "async", "steps": 8}, "running", 2, rows, 3.5,
                                    {"rollout": 0.9, "actor": 0.4}, [{"role": "reward", "replica": None, "tier": 1,
                                                                      "reason": "process died", "t_detect": 1.0}],
                                    [], [], {"active": [alert], "history": [alert], "delivery_errors": {}}))
    s = strict((folder / "status.json").read_text())  # a NaN loss is written as null
    assert s["last"]["loss"] is None and s["reward"] == [[0, 0.25], [1, 0.5]]
    assert read_status(folder.path) == s and not folder.complete
    (folder / "api.json").write_text(json.dumps({"url": "http://127.0.0.1:5555"}))
    (folder / "api_token").write_text("tok\n")
    assert main(["status", str(folder.path)]) == 0
    out = capsys.readouterr().out
    assert "running" in out and "2 / 8 steps (25%)" in out and "90.0%" in out
    assert "non-finite loss=nan at step 1" in out and "process died" in out
    assert "live view: http://127.0.0.1:5555/view#token=tok" in out
    folder.write_status({**s, "updated_at": s["updated_at"] - 3600})  # its driver stopped writing an hour ago
    assert main(["status", str(folder.path)]) == 0
    assert "no update for 36" in capsys.readouterr().out


def test_not_a_run_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 2
    assert "no status.json nor summary.json" in capsys.readouterr().err


def test_a_run_that_fails_leaves_a_failed_status_and_its_own_error(tmp_path, monkeypatch):
    import pytest

    import relax.controller as controller
    from relax.config import load_config

    def broken(cfg, progress=True):
        raise OSError("disk full")

    monkeypatch.setattr(controller, "warmup_state", broken)
    folder = RunFolder.create(tmp_path, "async", "cpu", "r")
    cfg = load_config(ROOT / "experiments/async/cpu.yaml")
    with pytest.raises(OSError, match="disk full"):  # the run's own error, not a status-writing one
        controller.Controller(cfg, folder.path, progress=False).run()
    s = read_status(folder.path)
    assert s["state"] == "failed" and s["error"] == "OSError: disk full" and s["steps_done"] == 0
