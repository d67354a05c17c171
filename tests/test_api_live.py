"""Elastic scaling during a live run: `relax run --api-port 0`, then scale out and in over HTTP (`relax scale`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def scale(run_dir: Path, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "relax.cli", "scale", "--run-dir", str(run_dir), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_scale_out_then_in_during_a_live_run(tmp_path):
    steps = 30
    env = {**os.environ, "RELAX_CACHE": os.environ.get("RELAX_CACHE", "/tmp/relax-cache"), "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-m", "relax.cli", "run", str(ROOT / "experiments/async/cpu.yaml"), "--no-progress",
           "--out", str(tmp_path), "--run", "live", "--api-port", "0", f"steps={steps}",
           "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=1", "warmup.steps=20",
           "task.eval_size=8", "health.heartbeat_timeout_s=600"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = tmp_path / "async" / "cpu" / "live"
    stopped = None
    try:
        wait_for(lambda: (run_dir / "api.json").exists(), 400, "the API", proc)
        url = json.loads((run_dir / "api.json").read_text())["url"]
        token = (run_dir / "api_token").read_text().strip()
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert httpx.get(f"{url}/rollout/engines").status_code == 401
        engines = c.get("/rollout/engines").json()["engines"]
        assert [(e["engine_id"], e["initial"]) for e in engines] == [("rollout-0", True)]
        # Hold the initial replica: from now on only a replica added over the API can produce samples, so
        # the run cannot end before the scale-in below (and the new replica's work is plain to see).
        stopped = engines[0]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        assert c.post("/rollout/scale_in", json={"num_replicas": 0}).status_code == 422
        assert c.post("/rollout/scale_in", json={"num_replicas": 1, "dry_run": True}).json()["status"] == "NOOP"
        op = scale(run_dir, "out", "2", "--wait")
        assert op["status"] == "ACTIVE", op
        assert [h["status"] for h in op["history"]] == ["PENDING", "CREATING", "HEALTH_CHECKING", "WEIGHT_SYNCING",
                                                         "READY", "ACTIVE"]
        assert op["weight_version"] >= 0

        def new_replica_worked():
            es = {e["engine_id"]: e for e in c.get("/rollout/engines").json()["engines"]}
            return es["rollout-1"]["groups_generated"] >= 2 and es

        es = wait_for(new_replica_worked, 120, "the new replica's first groups", proc)
        assert es["rollout-1"]["status"] == "ACTIVE"
        assert c.post("/rollout/scale_in", json={"num_replicas": 0}).status_code == 422
        r = c.post("/rollout/scale_in", json={"num_replicas": 1})
        assert r.status_code == 200
        done = wait_for(lambda: (b := c.get(f"/rollout/scale_in/{r.json()['request_id']}").json())["status"]
                        in ("COMPLETED", "FAILED") and b, 120, "scale-in", proc)
        assert [h["status"] for h in done["history"]] == ["PENDING", "DRAINING", "REMOVING", "COMPLETED"]
        assert done["engine_ids"] == ["rollout-1"] and done["error_message"] is None  # drained, not cut
        assert c.get("/rollout/engines").json()["total_engines"] == 1
        assert "relax_rollout_replicas 1" in c.get("/metrics").text
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run_dir / "recovery.json").read_text())
    assert [op["status"] for op in rec["scale_operations"]] == ["ACTIVE", "COMPLETED"]  # a dry run is no operation
    assert rec["events"] == []  # a stalled replica and a drained one are not failures
