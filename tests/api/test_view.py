"""The live view (/view) in a real headless browser: the page polls /status with the token from its URL fragment
and draws progress, the reward curve, utilisation, recoveries, scale operations and alerts; nothing external."""

from __future__ import annotations

import re
import time

import pytest

from relax.api.server import ApiServer, create_app

TOKEN = "view-token"


class LiveStatus:
    """A status that moves on at every authenticated read, as a running run's does."""

    def __init__(self):
        self.reads = 0

    def __call__(self) -> dict:
        self.reads += 1
        k = min(self.reads, 8)
        return {"run": "r1", "experiment": "async", "profile": "cpu", "mode": "async", "state": "running",
                "error": None, "updated_at": time.time(), "elapsed_s": 2.0 * k, "steps_done": k, "steps_total": 8,
                "reward": [[i, 0.1 + 0.05 * i] for i in range(k)], "last": {"step": k - 1, "reward_mean": 0.1},
                "busy_share": {"rollout": 0.8, "reward<b>": 0.1, "actor": 0.45},
                "recoveries": [{"role": "reward", "replica": None, "tier": 1, "reason": "process died",
                                "t_detect": 3.2, "ready_s": 1.5}],
                "faults": [], "scale_operations": [{"request_id": "x", "kind": "scale_out", "status": "ACTIVE",
                                                    "num_replicas": 2, "engine_ids": ["rollout-1"]}],
                "alerts": {"active": [], "history": [{"rule": "restarts", "state": "firing", "step": 2, "run": "r1",
                                                      "message": "reward restarted 1 time(s)", "time": 0.0}],
                           "delivery_errors": {}}}


@pytest.fixture
def server():
    status = LiveStatus()
    srv = ApiServer(create_app(None, TOKEN, status=status))  # /view and /status need no scaling manager
    srv.start()
    srv.status = status
    yield srv
    srv.stop()


def test_the_view_polls_status_and_shows_the_run(server, chromium, tmp_path):
    dom = chromium(f"{server.url}/view#token={TOKEN}", dump_dom=True, budget_ms=3500)
    assert server.status.reads >= 2  # it polled more than once: the page follows the run
    done = int(re.search(r'id="progress"[^>]*>(\d+) / 8 steps<', dom).group(1))
    assert 2 <= done <= server.status.reads
    points = re.search(r'id="reward-line"[^>]*points="([^"]*)"', dom).group(1).split()
    assert len(points) == done  # one vertex per step reported
    roles = re.search(r'<table id="roles">.*?</table>', dom, re.S).group(0)
    for role in ("rollout", "actor"):
        assert f"<td>{role}</td>" in roles
    assert "<td>reward&lt;b&gt;</td>" in roles  # the run's strings are text, never markup
    assert "process died" in dom and "rollout-1" in dom and "reward restarted 1 time(s)" in dom
    shot = tmp_path / "view.png"
    chromium(f"{server.url}/view#token={TOKEN}", screenshot=shot)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:4] == b"\x89PNG"


def test_without_the_token_the_view_asks_for_it_and_shows_no_data(server, chromium):
    dom = chromium(f"{server.url}/view", dump_dom=True, budget_ms=1500)
    assert server.status.reads == 0
    assert re.search(r'<div id="ask" class="card">', dom)  # no longer hidden
    assert re.search(r'id="progress"[^>]*>-<', dom)
    dom = chromium(f"{server.url}/view#token=wrong", dump_dom=True, budget_ms=1500)
    assert server.status.reads == 0 and "wrong token" in dom
