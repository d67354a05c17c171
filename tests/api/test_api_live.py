"""Elastic scaling during a live run: `relax run --api-port 0`, then scale out and in over HTTP (`relax scale`), then
stop the run (`relax stop`): the run's length never races the phases, whatever the machine's load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def wait_for(fn, timeout: float, what: str, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) while waiting for {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def relax(verb: str, run_dir: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "relax.cli", verb, "--run-dir", str(run_dir), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_scale_out_then_in_during_a_live_run_the_serving_engines_follow_the_replica_count(tmp_path):
    from experiments.recovery.elastic import run_phases

    steps = 1000  # far more than the phases need: the test stops the run once they are done
    env = {**os.environ, "RELAX_CACHE": os.environ.get("RELAX_CACHE", "/tmp/relax-cache")}
    cmd = [sys.executable, "-m", "relax.cli", "run", str(ROOT / "experiments/async/cpu.yaml"), "--no-progress",
           "--out", str(tmp_path), "--run", "live", "--api-port", "0", f"steps={steps}",
           "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=1", "warmup.steps=20",
           "task.eval_size=8", "health.heartbeat_timeout_s=600"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "async" / "cpu" / "live"
    try:
        wait_for(lambda: (run_dir / "api.json").exists(), 400, "the API", proc)
        url = json.loads((run_dir / "api.json").read_text())["url"]
        token = (run_dir / "api_token").read_text().strip()
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert httpx.get(f"{url}/rollout/engines").status_code == 401
        assert httpx.get(f"{url}/health").status_code == 200
        # `relax scale` reads the address and the token the run wrote.
        engines = relax("scale", run_dir, "engines")["engines"]
        assert [(e["engine_id"], e["initial"]) for e in engines] == [("rollout-0", True)]
        assert relax("scale", run_dir, "in", "1", "--dry-run")["status"] == "NOOP"
        assert relax("scale", run_dir, "out", "1")["status"] == "NOOP"
        assert c.post("/rollout/scale_in", json={"num_replicas": 0}).status_code == 422
        # issue 16: hostile requests are refused without touching the run
        r = c.post("/rollout/scale_out", json={"num_replicas": 1_000_000_000})
        assert r.status_code == 400 and "rollout.max_replicas" in r.json()["detail"]
        for body in ('{"num_replicas": 2, "timeout_secs": NaN}', '{"num_replicas": Infinity}'):
            assert c.post("/rollout/scale_out", content=body, headers={"Content-Type": "application/json"}).status_code == 422
        assert httpx.get(f"{url}/rollout/engines", headers={"Authorization": "Bearer \u00e9".encode()}).status_code == 401
        assert c.get("/openapi.json").status_code == 200

        phases = run_phases(url, token, groups=4, timeout=300, alive=lambda: proc.poll() is None)
        # Which engines served requests follows the replica count: 1, then 2 (the added one too), then 1.
        assert [p["engines_serving"] for p in phases["phases"]] == [1, 2, 1]
        assert set(phases["phases"][1]["groups_by_engine"]) == {"rollout-0", "rollout-1"}
        assert phases["phases"][1]["groups_by_engine"]["rollout-1"] >= 1
        assert set(phases["phases"][2]["groups_by_engine"]) == {"rollout-0"}  # the added one is gone
        out, scale_in = phases["operations"]
        assert out["history"] == ["PENDING", "CREATING", "HEALTH_CHECKING", "WEIGHT_SYNCING", "READY", "ACTIVE"]
        assert out["weight_version"] >= 0 and out["engine_ids"] == ["rollout-1"]
        assert scale_in["history"] == ["PENDING", "DRAINING", "REMOVING", "COMPLETED"]
        assert scale_in["engine_ids"] == ["rollout-1"] and scale_in["drained"]  # drained, not cut
        stop = relax("stop", run_dir)
        assert stop["status"] == "stopping" and stop["steps"] == steps
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 1 and "run stopped: stopped over the control API" in out, out[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_planned"] == steps and stop["steps_done"] <= summary["steps"] < steps
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run_dir / "recovery.json").read_text())
    # NOOPs are not stored (issue 16), and the dry run above was a NOOP (nothing to remove)
    assert [op["status"] for op in rec["scale_operations"]] == ["ACTIVE", "COMPLETED"]
    assert rec["events"] == []  # a drained replica is not a failure
