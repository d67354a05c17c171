"""One live run, watched three ways: `relax status` while it goes on, the API's /view in headless chromium, and the
alerts it raises (a killed role -> the restart alert, delivered exactly once to a loopback receiver through Apprise
and the plain webhook); then `relax status` on the finished folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relax.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
STEPS = 20
ROLES = ("rollout", "reward", "reference", "advantages", "actor")


def wait_for(fn, timeout: float, what: str, proc):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) while waiting for {what}:\n"
                                 f"{proc.stdout.read()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def relax_status(run_dir: Path, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "relax.cli", "status", str(run_dir), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def live(tmp_path_factory, module_receiver):
    out = tmp_path_factory.mktemp("live")
    rx = module_receiver
    cmd = [sys.executable, "-m", "relax.cli", "run", "experiments/async/cpu.yaml", "--no-progress", "--out", str(out),
           "--run", "live", "--api-port", "0", f"steps={STEPS}", "rollout.prompts_per_step=4", "rollout.group_size=4",
           "rollout.chunk_groups=1", "warmup.steps=20", "task.eval_size=8", "health.heartbeat_timeout_s=600",
           "faults=[{role: reward, at_step: 2, kind: kill}]", "alerts.rules.restarts={max: 0}",
           "alerts.rules.non_finite={}", "alerts.min_interval_s=0", f"alerts.webhook={rx.url('/hook')}",
           f"alerts.urls=[json://127.0.0.1:{rx.port}/apprise]"]
    env = {**os.environ, "RELAX_CACHE": os.environ.get("RELAX_CACHE", "/tmp/relax-cache"), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = out / "async" / "cpu" / "live"
    try:
        # live: the API is up, a few steps are done and the killed reward role has been recovered
        wait_for(lambda: (run_dir / "api.json").exists(), 600, "the API", proc)
        wait_for(lambda: (s := RunFolder(run_dir).status()) and s["steps_done"] >= 4 and s["recoveries"], 600,
                 "4 steps and a recovery", proc)
        yield proc, run_dir, rx
    finally:  # the last test waits for the run's end; a run still going here means a test failed early
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()


def test_relax_status_while_the_run_goes_on(live):
    proc, run_dir, _ = live
    text = relax_status(run_dir)
    assert proc.poll() is None, "the run ended before its live status was read"
    assert "running" in text and f"/ {STEPS} steps" in text
    for role in ROLES:
        assert role in text
    assert "live view: http://127.0.0.1:" in text and "/view#token=" in text
    status = json.loads(relax_status(run_dir, "--json"))
    assert status["state"] == "running" and 4 <= status["steps_done"] < STEPS
    assert [r for _, r in status["reward"]] and set(status["busy_share"]) == set(ROLES)
    assert all(0 < v <= 1 for v in status["busy_share"].values())


def test_the_live_view_in_headless_chromium(live, chromium, tmp_path):
    proc, run_dir, _ = live
    api = json.loads((run_dir / "api.json").read_text())
    url = f"{api['url']}/view#token={(run_dir / 'api_token').read_text().strip()}"
    before = RunFolder(run_dir).status()["steps_done"]
    dom = chromium(url, dump_dom=True, budget_ms=3000)
    shot = tmp_path / "live_view.png"
    chromium(url, screenshot=shot)
    after = RunFolder(run_dir).status()["steps_done"]
    assert proc.poll() is None, "the run ended before the page was read"
    done = int(re.search(rf'id="progress"[^>]*>(\d+) / {STEPS} steps<', dom).group(1))
    assert before <= done <= after
    points = re.search(r'id="reward-line"[^>]*points="([^"]*)"', dom).group(1).split()
    assert len(points) == done  # the reward curve: one vertex per step done
    roles = re.search(r'<table id="roles">.*?</table>', dom, re.S).group(0)
    for role in ROLES:
        assert f"<td>{role}</td>" in roles
    recoveries = re.search(r'<table id="recoveries">.*?</table>', dom, re.S).group(0)
    assert "<td>reward</td>" in recoveries and "process died" in recoveries
    assert "restarts" in re.search(r'<table id="alerts">.*?</table>', dom, re.S).group(0)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:4] == b"\x89PNG"
    if os.environ.get("RELAX_VIEW_SCREENSHOT"):  # to refresh the README's picture
        Path(os.environ["RELAX_VIEW_SCREENSHOT"]).write_bytes(shot.read_bytes())


def test_a_killed_role_raises_the_restart_alert_exactly_once(live):
    proc, run_dir, rx = live
    assert proc.wait(timeout=900) == 0, proc.stdout.read()[-3000:]
    hook = [(m["rule"], m["state"]) for m in rx.at("/hook")]
    assert hook == [("restarts", "firing")]  # once, never repeated, never resolved within the window; no NaN
    assert "reward restarted 1 time(s)" in rx.at("/hook")[0]["message"]
    assert [m["title"] for m in rx.at("/apprise")] == ["[relax] FIRING: restarts (async/live)"]
    # after the run: the same summary from its result files
    text = relax_status(run_dir)
    assert "finished" in text and f"{STEPS} / {STEPS} steps" in text and "restarts" in text
    status = json.loads(relax_status(run_dir, "--json"))
    assert status["state"] == "finished" and status["steps_done"] == STEPS
    assert [e["role"] for e in status["recoveries"]] == ["reward"]
    assert [a["rule"] for a in status["alerts"]["active"]] == ["restarts"]
    assert status["alerts"]["delivery_errors"] == {}
