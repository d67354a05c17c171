"""A local run is closed to the network (issue 16): Ray and every server the run starts listen on loopback only,
and Ray refuses a client without the run's token."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from relax.loopback import is_loopback

pytestmark = pytest.mark.slow

JOIN = "import ray, sys; ray.init(address=sys.argv[1]); print('JOINED', flush=True)"


def _join(address: str, env: dict) -> subprocess.CompletedProcess:
    """A separate driver connecting to `address` with only `env`'s Ray settings (and a loopback node address,
    as the node listens on nothing else)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    e.update(env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    return subprocess.run([sys.executable, "-c", JOIN, address], env=e, capture_output=True, text=True, timeout=300)


def test_a_local_session_keeps_token_auth_on_and_restores_the_environment(monkeypatch):
    import ray

    from relax.cluster import RaySession

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # ignored for a local run
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with RaySession(num_cpus=1):
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        address = ray.get_runtime_context().gcs_address
        token = os.environ["RAY_AUTH_TOKEN"]
        refused = _join(address, {"RAY_AUTH_MODE": "disabled"})
        assert refused.returncode != 0 and "JOINED" not in refused.stdout
        assert "AuthenticationError" in refused.stderr and "InvalidAuthToken" in refused.stderr
        joined = _join(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert joined.returncode == 0 and "JOINED" in joined.stdout, joined.stderr[-2000:]
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN" not in os.environ


def test_a_dcs_store_listens_on_its_host_only():
    from relax.weights.transport import store

    st = store("127.0.0.1", 0, master=True, timeout_s=10, wait_for_workers=False)
    client = store("127.0.0.1", st.port, master=False, timeout_s=10)
    client.set("k", "v")
    assert st.get("k") == b"v"
    mine = [c.laddr for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert (("127.0.0.1", st.port)) in [(a.ip, a.port) for a in mine]
    assert all(a.port != st.port or is_loopback(a.ip) for a in mine)


def test_a_local_run_listens_on_loopback_only(torch_http_run):
    """`relax run` with the control API and the torch engine HTTP server (its weight-update gloo group and the DCS
    store too): sampled while it trains, every socket of the run's own process tree (the driver, Ray's processes,
    the roles, TransferQueue, the engine server, and the server a Tier 1 restart launched) listens on loopback.
    The run (tests/conftest.py) is shared with tests/test_e2e.py and tests/engines/test_remote_engine.py."""
    run = torch_http_run
    assert run.returncode == 0, run.log[-4000:]
    seen, run_dir = run.seen, run.run_dir
    exposed = {addr: who for addr, who in seen.items() if not is_loopback(addr[0])}
    assert not exposed, f"listening beyond loopback: {exposed}"
    api_port = int(json.loads((run_dir / "api.json").read_text())["url"].rsplit(":", 1)[1])
    assert any(port == api_port for _, port in seen)  # the sampling saw the run's servers
    names = " ".join(seen.values())
    assert "gcs_server" in names and "raylet" in names
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
