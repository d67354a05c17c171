"""`relax run` joins an existing Ray cluster when RAY_ADDRESS is set (multi-node: `ray start --head` on one node,
`ray start --address=HEAD:6379` on the others, then `RAY_ADDRESS=auto relax run ...`), instead of starting its own."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAD = r"""
import json, sys, ray
ray.init(num_cpus=3, include_dashboard=False, _temp_dir=sys.argv[1])
print(json.dumps({"address": ray.get_runtime_context().gcs_address}), flush=True)
sys.stdin.read()  # until the test closes our stdin
ray.shutdown()
"""

DRIVER = r"""
import json, ray
from relax.cluster import RaySession
with RaySession(num_cpus=1) as s:
    print(json.dumps({"cpus": ray.cluster_resources().get("CPU"), "address": ray.get_runtime_context().gcs_address,
                      "joined": s.address}))
print(json.dumps({"after": ray.is_initialized()}))
"""


@pytest.mark.slow
def test_ray_session_joins_the_cluster_named_by_ray_address():
    temp = tempfile.mkdtemp(prefix="relax-join-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # a cluster with Ray's token auth on, its token shared by the head and the driver (README, "Network exposure")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen([sys.executable, "-c", HEAD, temp], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        address = json.loads(head.stdout.readline())["address"]
        out = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=180,
                             env=dict(env, RAY_ADDRESS=address), cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = [json.loads(x) for x in out.stdout.strip().splitlines()]
        # the head's 3 CPUs (not a private instance with the 1 CPU asked for), and the head's address
        assert lines[0] == {"cpus": 3.0, "address": address, "joined": address}
        assert lines[1] == {"after": False}  # the driver disconnects; the cluster stays up
        assert head.poll() is None
    finally:
        head.stdin.close()
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp, ignore_errors=True)
