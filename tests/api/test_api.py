"""The elastic scaling API (relax.api) against a fake rollout pool: auth, schema, state machines, 400/404/409."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from relax.api.scaling import ScaleManager
from relax.api.server import create_app, start_api

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakePool:
    """A RolloutPool whose stages can be held (`hold[stage]` is an Event the stage waits on) or made to fail."""

    def __init__(self, initial: int = 1):
        self.reps = {f"rollout-{i}": {"initial": True, "status": "ACTIVE"} for i in range(initial)}
        self.n = initial
        self.calls: list[tuple[str, str]] = []
        self.hold: dict[str, threading.Event] = {}
        self.fail: set[str] = set()

    def _stage(self, name: str, rid: str) -> None:
        self.calls.append((name, rid))
        if name in self.hold:
            assert self.hold[name].wait(10), f"{name} held too long"
        if name in self.fail:
            raise RuntimeError(f"{name} failed for {rid}")

    def engines(self):
        return [{"engine_id": rid, "initial": r["initial"], "status": r["status"], "is_healthy": True, "pid": None,
                 "weight_version": 3} for rid, r in self.reps.items()]

    def count(self):
        return sum(1 for r in self.reps.values() if r["status"] not in ("DRAINING", "REMOVING"))

    def create_replica(self):
        rid = f"rollout-{self.n}"
        self.n += 1
        self.reps[rid] = {"initial": False, "status": "CREATING"}
        self._stage("create", rid)
        return rid

    def health_check(self, rid, timeout):
        self._stage("health", rid)

    def sync_weights(self, rid):
        self._stage("sync", rid)
        return 3

    def activate(self, rid):
        self._stage("activate", rid)
        self.reps[rid]["status"] = "ACTIVE"

    def drain(self, rid, timeout):
        self.reps[rid]["status"] = "DRAINING"
        self._stage("drain", rid)
        return True

    def remove(self, rid):
        self._stage("remove", rid)
        del self.reps[rid]


@pytest.fixture
def pool():
    return FakePool(initial=2)


@pytest.fixture
def client(pool):
    manager = ScaleManager(pool, timeout_s=5, drain_timeout_s=5)
    app = create_app(manager, TOKEN, metrics=lambda: {"weights_version": 3, "role_restarts": {"rollout-0": 1, "reward": 0}},
                     status=lambda: {"state": "running", "steps_done": 2, "note": "secret-status"})
    with TestClient(app) as c:
        c.manager = manager
        yield c
    manager.wait(10)


def wait_status(client, kind, rid, statuses, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = client.get(f"/rollout/{kind}/{rid}", headers=AUTH).json()
        if body["status"] in statuses:
            return body
        time.sleep(0.01)
    raise AssertionError(f"{kind} {rid} never reached {statuses}: {body}")


PROTECTED = [("post", "/rollout/scale_out", {"num_replicas": 3}), ("get", "/rollout/scale_out/x", None),
             ("post", "/rollout/scale_out/x/cancel", None), ("post", "/rollout/scale_in", {"num_replicas": 2}),
             ("get", "/rollout/scale_in/x", None), ("get", "/rollout/engines", None), ("get", "/metrics", None),
             ("get", "/openapi.json", None), ("get", "/status", None), ("post", "/run/stop", None)]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_every_endpoint_but_health_needs_the_token(client, headers):
    for method, path, body in PROTECTED:
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (path, r.status_code)
        assert r.headers["www-authenticate"] == "Bearer"
    assert client.get("/health").status_code == 200
    assert client.get("/docs").status_code == 404  # no unauthenticated schema anywhere
    view = client.get("/view", headers=headers)  # the live view's page holds no data: it asks /status with the token
    assert view.status_code == 200 and view.headers["content-type"].startswith("text/html")
    assert "secret-status" not in view.text and 'fetch("status"' in view.text


def test_status_serves_the_runs_live_status_and_the_view_is_self_contained(client):
    body = client.get("/status", headers=AUTH).json()
    assert body == {"state": "running", "steps_done": 2, "note": "secret-status"}
    page = client.get("/view").text
    assert "<script" in page and "http://" not in page and "https://" not in page  # no external asset


def test_openapi_schema_lists_the_api_with_bearer_auth(client):
    schema = client.get("/openapi.json", headers=AUTH).json()
    paths = schema["paths"]
    for path in ["/rollout/scale_out", "/rollout/scale_out/{request_id}", "/rollout/scale_out/{request_id}/cancel",
                 "/rollout/scale_in", "/rollout/scale_in/{request_id}", "/rollout/engines", "/health", "/metrics"]:
        assert path in paths, path
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    body = schema["components"]["schemas"]["ScaleInRequest"]["properties"]
    assert set(body) == {"num_replicas", "force", "dry_run"}
    assert "security" not in paths["/health"]["get"] and paths["/rollout/engines"]["get"]["security"]


def test_scale_out_walks_every_state_then_scale_in_drains_before_removing(client, pool):
    r = client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH)
    assert r.status_code == 200
    op = wait_status(client, "scale_out", r.json()["request_id"], {"ACTIVE", "FAILED"})
    assert [h["status"] for h in op["history"]] == ["PENDING", "CREATING", "HEALTH_CHECKING", "WEIGHT_SYNCING",
                                                     "READY", "ACTIVE"]
    assert op["engine_ids"] == ["rollout-2"] and op["weight_version"] == 3
    # weights are synced before the replica serves
    assert [c for c, rid in pool.calls if rid == "rollout-2"] == ["create", "health", "sync", "activate"]
    engines = client.get("/rollout/engines", headers=AUTH).json()
    assert engines["total_engines"] == 3

    r = client.post("/rollout/scale_in", json={"num_replicas": 2}, headers=AUTH)
    op = wait_status(client, "scale_in", r.json()["request_id"], {"COMPLETED", "FAILED"})
    assert [h["status"] for h in op["history"]] == ["PENDING", "DRAINING", "REMOVING", "COMPLETED"]
    assert op["engine_ids"] == ["rollout-2"]
    assert pool.calls[-2:] == [("drain", "rollout-2"), ("remove", "rollout-2")]
    assert client.get("/rollout/engines", headers=AUTH).json()["total_engines"] == 2


def test_noop_when_the_target_is_met(client, pool):
    r = client.post("/rollout/scale_out", json={"num_replicas": 2}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "NOOP"
    # a NOOP is not stored (issue 16: recovery.json grew with every one): its id answers 404
    assert client.get(f"/rollout/scale_out/{r.json()['request_id']}", headers=AUTH).status_code == 404
    r = client.post("/rollout/scale_in", json={"num_replicas": 2}, headers=AUTH)
    assert r.json()["status"] == "NOOP"
    assert pool.calls == []


def test_second_operation_while_one_runs_is_409(client, pool):
    pool.hold["health"] = threading.Event()
    first = client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH).json()
    wait_status(client, "scale_out", first["request_id"], {"HEALTH_CHECKING"})
    assert client.post("/rollout/scale_out", json={"num_replicas": 4}, headers=AUTH).status_code == 409
    assert client.post("/rollout/scale_in", json={"num_replicas": 2, "force": True}, headers=AUTH).status_code == 409
    pool.hold["health"].set()
    wait_status(client, "scale_out", first["request_id"], {"ACTIVE"})
    # Once it is done, the next one is accepted.
    assert client.post("/rollout/scale_out", json={"num_replicas": 4}, headers=AUTH).status_code == 200


def test_initial_replicas_cannot_be_removed_and_dry_run_removes_nothing(client, pool):
    r = client.post("/rollout/scale_in", json={"num_replicas": 1}, headers=AUTH)
    assert r.status_code == 400 and "initial" in r.json()["detail"]
    pool.reps["rollout-7"] = {"initial": False, "status": "ACTIVE"}
    pool.reps["rollout-9"] = {"initial": False, "status": "ACTIVE"}
    r = client.post("/rollout/scale_in", json={"num_replicas": 3, "dry_run": True}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "DRY_RUN"
    assert r.json()["engine_ids"] == ["rollout-9"]  # newest first
    assert pool.calls == [] and len(pool.reps) == 4
    assert client.post("/rollout/scale_in", json={"num_replicas": 0}, headers=AUTH).status_code == 422
    assert client.post("/rollout/scale_in", json={"num_replicas": 2, "bogus": 1}, headers=AUTH).status_code == 422


def test_cancel_rolls_back_and_failure_rolls_back(client, pool):
    pool.hold["sync"] = threading.Event()
    op = client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH).json()
    wait_status(client, "scale_out", op["request_id"], {"WEIGHT_SYNCING"})
    r = client.post(f"/rollout/scale_out/{op['request_id']}/cancel", headers=AUTH)
    assert r.status_code == 200
    pool.hold["sync"].set()
    done = wait_status(client, "scale_out", op["request_id"], {"CANCELLED", "ACTIVE", "FAILED"})
    assert done["status"] == "CANCELLED" and "rollout-2" not in pool.reps
    assert client.post(f"/rollout/scale_out/{op['request_id']}/cancel", headers=AUTH).status_code == 409
    assert client.post("/rollout/scale_out/nope/cancel", headers=AUTH).status_code == 404
    assert client.get("/rollout/scale_in/nope", headers=AUTH).status_code == 404

    pool.fail.add("health")
    op = client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH).json()
    done = wait_status(client, "scale_out", op["request_id"], {"FAILED", "ACTIVE"})
    assert done["status"] == "FAILED" and "health failed" in done["error_message"]
    assert len(pool.reps) == 2  # the replica it created is gone again


def test_metrics_are_prometheus_text(client):
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics", headers=AUTH)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(r.text) for s in fam.samples}
    assert samples[("relax_rollout_replicas", ())] == 2
    assert samples[("relax_weights_version", ())] == 3
    assert samples[("relax_role_restarts_total", (("role", "rollout-0"),))] == 1
    assert samples[("relax_role_restarts_total", (("role", "reward"),))] == 0
    assert "# TYPE relax_role_restarts_total counter" in r.text
    assert not any(name == "relax_staleness_mean" for name, _ in samples)  # unknown yet: left out, not 0


def test_metrics_speak_openmetrics_when_asked(client):
    r = client.get("/metrics", headers={**AUTH, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


def test_server_thread_writes_a_private_token_and_answers(tmp_path, pool):
    server = start_api(tmp_path, ScaleManager(pool), port=0)
    try:
        token = (tmp_path / "api_token").read_text().strip()
        assert stat.S_IMODE(os.stat(tmp_path / "api_token").st_mode) == 0o600
        with httpx.Client(base_url=server.url) as c:
            assert c.get("/health").status_code == 200
            assert c.get("/rollout/engines").status_code == 401
            assert c.get("/rollout/engines", headers={"Authorization": f"Bearer {token}"}).json()["total_engines"] == 2
    finally:
        server.stop()


def test_forced_scale_in_removes_without_draining(client, pool):
    pool.reps["rollout-5"] = {"initial": False, "status": "ACTIVE"}
    r = client.post("/rollout/scale_in", json={"num_replicas": 2, "force": True}, headers=AUTH)
    op = wait_status(client, "scale_in", r.json()["request_id"], {"COMPLETED", "FAILED"})
    assert op["status"] == "COMPLETED" and op["force"] and op["engine_ids"] == ["rollout-5"]
    assert pool.calls == [("remove", "rollout-5")]  # no drain


def test_relax_scale_cli_reads_the_run_dir_and_drives_every_operation(tmp_path, pool, capsys):
    import argparse

    from relax.api import cli

    def relax_scale(*argv: str, run_dir=tmp_path) -> tuple[int, dict | str]:
        parser = argparse.ArgumentParser()
        cli.register(parser.add_subparsers())
        args = parser.parse_args(["scale", *(["--run-dir", str(run_dir)] if run_dir else []), *argv])
        rc = args.func(args)
        out = capsys.readouterr()
        try:
            return rc, json.loads(out.out)
        except json.JSONDecodeError:
            return rc, out.out + out.err

    manager = ScaleManager(pool, timeout_s=5, drain_timeout_s=5)
    server = start_api(tmp_path, manager, port=0)
    try:
        rc, op = relax_scale("out", "3", "--wait")
        assert rc == 0 and op["status"] == "ACTIVE" and op["engine_ids"] == ["rollout-2"]
        rc, body = relax_scale("status", op["request_id"])
        assert rc == 0 and body["status"] == "ACTIVE"
        rc, body = relax_scale("engines")
        assert rc == 0 and body["total_engines"] == 3
        rc, body = relax_scale("in", "2", "--dry-run")
        assert rc == 0 and body["status"] == "DRY_RUN" and body["engine_ids"] == ["rollout-2"] and len(pool.reps) == 3
        rc, body = relax_scale("in", "2", "--wait")
        assert rc == 0 and body["status"] == "COMPLETED" and len(pool.reps) == 2
        rc, body = relax_scale("status", body["request_id"])  # a scale-in id is found too
        assert rc == 0 and body["kind"] == "scale_in"
        rc, text = relax_scale("metrics")
        assert rc == 0 and "relax_rollout_replicas 2.0" in text
        rc, text = relax_scale("in", "1")  # initial replicas stay: HTTP 400, exit 1
        assert rc == 1 and "HTTP 400" in text
        pool.hold["health"] = threading.Event()
        rc, op = relax_scale("out", "3")
        assert rc == 0 and op["status"] in ("PENDING", "CREATING", "HEALTH_CHECKING")
        rc, text = relax_scale("out", "4")
        assert rc == 1 and "HTTP 409" in text
        rc, body = relax_scale("cancel", op["request_id"])
        assert rc == 0
        pool.hold["health"].set()
        manager.wait(10)
        assert manager.get(op["request_id"]).status == "CANCELLED"
        # The token is what authorises: a wrong one is refused (401), a missing run dir is named.
        rc, text = relax_scale("--url", server.url, "--token", "wrong", "engines", run_dir=None)
        assert rc == 1 and "HTTP 401" in text
        with pytest.raises(SystemExit, match="api.json not found"):
            relax_scale("engines", run_dir=tmp_path / "nowhere")
    finally:
        server.stop()


# ---- issue 16: no request can hurt the run -------------------------------------------------------------------


def make_client(pool, **kw):
    manager = ScaleManager(pool, timeout_s=5, drain_timeout_s=5, **kw)
    c = TestClient(create_app(manager, TOKEN))
    c.manager = manager
    return c


def test_num_replicas_is_bounded_by_the_configured_maximum_and_the_cluster(pool):
    c = make_client(pool, max_replicas=4)
    r = c.post("/rollout/scale_out", json={"num_replicas": 1_000_000_000}, headers=AUTH)
    assert r.status_code == 400 and "rollout.max_replicas=4" in r.json()["detail"]
    pool.capacity = lambda: 3  # what the cluster's free resources can place
    r = c.post("/rollout/scale_out", json={"num_replicas": 4}, headers=AUTH)
    assert r.status_code == 400 and "cluster can place: 3" in r.json()["detail"]
    assert pool.calls == [] and c.manager.ops == {}
    assert c.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH).status_code == 200
    c.manager.wait(10)


def test_cancel_stops_a_creation_in_progress(client, pool):
    pool.hold["create"] = threading.Event()
    op = client.post("/rollout/scale_out", json={"num_replicas": 12}, headers=AUTH).json()
    wait_status(client, "scale_out", op["request_id"], {"CREATING"})
    assert client.post(f"/rollout/scale_out/{op['request_id']}/cancel", headers=AUTH).status_code == 200
    pool.hold["create"].set()
    done = wait_status(client, "scale_out", op["request_id"], {"CANCELLED", "FAILED", "ACTIVE"})
    assert done["status"] == "CANCELLED"
    created = [rid for name, rid in pool.calls if name == "create"]
    assert len(created) == 1  # the one being created when cancel came; none of the other 9
    assert set(pool.reps) == {"rollout-0", "rollout-1"}  # rolled back


def test_two_identical_scale_outs_sent_together_give_200_and_409(client, pool):
    pool.hold["health"] = threading.Event()
    codes, start = [], threading.Barrier(2)

    def send():
        start.wait()
        codes.append(client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH).status_code)

    threads = [threading.Thread(target=send) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(10) for t in threads]
    assert sorted(codes) == [200, 409]
    # one sent after the first is admitted, while its replica is still HEALTH_CHECKING: 409, not NOOP
    r = client.post("/rollout/scale_out", json={"num_replicas": 3}, headers=AUTH)
    assert r.status_code == 409 and any(s in r.json()["detail"] for s in ("CREATING", "HEALTH_CHECKING"))
    pool.hold["health"].set()


@pytest.mark.parametrize("header", ["Bearer \u00e9t\u00e9".encode("utf-8"), "Bearer \u00e9".encode("latin-1"),
                                    b"Bearer \xff\xfe", b"Basic \xc3\xa9"])
def test_a_non_ascii_token_is_401(client, header):
    r = client.get("/rollout/engines", headers={"Authorization": header})
    assert r.status_code == 401


@pytest.mark.parametrize("body", ['{"num_replicas": 3, "timeout_secs": NaN}',
                                  '{"num_replicas": 3, "timeout_secs": Infinity}',
                                  '{"num_replicas": 3, "timeout_secs": -Infinity}',
                                  '{"num_replicas": NaN}', '{"num_replicas": 1e400}', '{"num_replicas": Infinity}'])
def test_nan_and_infinity_are_422(client, pool, body):
    for path in ("/rollout/scale_out", "/rollout/scale_in"):
        r = client.post(path, content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 422, (path, r.text)
        assert {"loc", "msg", "type"} <= set(r.json()["detail"][0])
    assert pool.calls == []


def test_the_schema_documents_every_status_code_each_endpoint_returns(client):
    paths = client.get("/openapi.json", headers=AUTH).json()["paths"]
    want = {("post", "/rollout/scale_out"): {200, 400, 401, 409, 422},
            ("get", "/rollout/scale_out/{request_id}"): {200, 401, 404, 422},
            ("post", "/rollout/scale_out/{request_id}/cancel"): {200, 401, 404, 409, 422},
            ("post", "/rollout/scale_in"): {200, 400, 401, 409, 422},
            ("get", "/rollout/scale_in/{request_id}"): {200, 401, 404, 422},
            ("get", "/rollout/engines"): {200, 401}, ("get", "/metrics"): {200, 401}, ("get", "/health"): {200},
            ("get", "/status"): {200, 401}, ("get", "/view"): {200}, ("post", "/run/stop"): {200, 401, 501}}
    for (method, path), codes in want.items():
        assert {int(c) for c in paths[path][method]["responses"]} == codes, (method, path)


def test_a_dry_run_id_can_be_queried(client, pool):
    pool.reps["rollout-7"] = {"initial": False, "status": "ACTIVE"}
    op = client.post("/rollout/scale_in", json={"num_replicas": 2, "dry_run": True}, headers=AUTH).json()
    r = client.get(f"/rollout/scale_in/{op['request_id']}", headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "DRY_RUN" and r.json()["engine_ids"] == ["rollout-7"]
    assert pool.calls == [] and "rollout-7" in pool.reps


def test_finished_operations_are_kept_up_to_a_bound_and_noops_not_at_all(pool):
    c = make_client(pool, keep_finished=3)
    pool.reps["rollout-7"] = {"initial": False, "status": "ACTIVE"}
    ids = [c.post("/rollout/scale_in", json={"num_replicas": 2, "dry_run": True}, headers=AUTH).json()["request_id"]
           for _ in range(5)]
    for _ in range(50):
        assert c.post("/rollout/scale_out", json={"num_replicas": 1}, headers=AUTH).json()["status"] == "NOOP"
    assert list(c.manager.ops) == ids[-3:]  # the newest finished ones, no NOOP
    assert len(c.manager.views()) == 3


def test_the_pool_is_walked_through_a_snapshot_while_the_api_adds_replicas(monkeypatch):
    """The supervisor iterates `pool.snapshot()` (taken under the pool's lock), not `pool.replicas`, so a
    scale_out adding replicas from the API thread cannot break its walk (issue 16: dictionary changed size)."""
    from relax.api import pool as pool_mod

    p = pool_mod.RayRolloutPool(lambda i: object(), lambda h, i: None, queue=None, need={"CPU": 2, "GPU": 0})
    stop = threading.Event()

    def add():
        for _ in range(3000):
            if stop.is_set():
                return
            p.create_replica()

    t = threading.Thread(target=add)
    t.start()
    try:
        while t.is_alive():
            _ = [r.status for r in p.snapshot().values()]
    finally:
        stop.set()
        t.join(10)
    assert len(p.snapshot()) == p.next_index
    monkeypatch.setattr(pool_mod.ray, "available_resources", lambda: {"CPU": 5.0})
    assert p.capacity() == p.count() + 2  # 5 free CPUs, 2 per replica; GPU 0 is no constraint
    assert pool_mod.RayRolloutPool(lambda i: None, lambda h, i: None, queue=None).capacity() is None


def test_every_metric_the_dashboard_queries_is_exported(pool):
    """With every value the supervisor reports, the page exports exactly EXPORTED, and the dashboard queries
    only those (tests/metrics/test_sinks_e2e.py checks the dashboard against a live run's page too)."""
    from relax.api.prometheus import EXPORTED, METRICS, dashboard_metric_names, exported_names

    full = {key: ({"actor": 1, "rollout-0": 2} if label else 1) for key, (_, _, _, label) in METRICS.items()}
    full.pop("rollout_replicas"), full.pop("rollout_replicas_healthy"), full.pop("scale_operations")  # the app's own
    manager = ScaleManager(pool)
    with TestClient(create_app(manager, TOKEN, metrics=lambda: full)) as c:
        text = c.get("/metrics", headers=AUTH).text
    assert exported_names(text) == set(EXPORTED)
    used = dashboard_metric_names()
    assert len(used) >= 20 and used <= set(EXPORTED), used - set(EXPORTED)


def test_run_stop_asks_the_schedule_loop_to_end_the_run_once(pool, tmp_path):
    """POST /run/stop hands the request to the run (RunContext.stop_reason); the schedule's loop then raises
    RunStopped, marked as asked for. Without a run behind the server it is 501."""
    from relax.schedules.context import RunContext, RunStopped

    assert TestClient(create_app(ScaleManager(pool), TOKEN)).post("/run/stop", headers=AUTH).status_code == 501
    ctx = RunContext(cfg=None, run_dir=tmp_path, bus=None, telemetry=None, role_names=[], records={0: {}, 1: {}})
    ctx.obey_stop()  # nothing asked: the loop goes on

    from relax.fault.supervisor import Supervisor

    run = SimpleNamespace(ctx=ctx, cfg=SimpleNamespace(steps=9))  # what Supervisor.request_stop reads
    c = TestClient(create_app(ScaleManager(pool), TOKEN, stop=lambda: Supervisor.request_stop(run)))
    reason = "stopped over the control API after 2 of 9 steps"
    assert c.post("/run/stop", headers=AUTH).json() == {"status": "stopping", "reason": reason, "steps_done": 2,
                                                         "steps": 9}
    ctx.records[2] = {}
    again = c.post("/run/stop", headers=AUTH).json()
    assert again["reason"] == reason and again["steps_done"] == 3  # the first request's reason holds
    with pytest.raises(RunStopped, match=reason) as err:
        ctx.obey_stop()
    assert err.value.requested and err.value.run_dir == tmp_path
