"""GPU placement (relax/placement.py) on Ray's logical GPUs: a CPU machine started with `num_gpus=4` schedules
placement groups of GPU bundles without CUDA. Small probe actors stand in for the role processes (the real roles
would load CUDA): each is placed with exactly the options the supervisor, MegatronGroup and the SGLang launcher use.
"""

import os
import time
from pathlib import Path

import pytest
import ray

from relax import placement
from relax.config import load_config
from relax.cluster import RaySession
from relax.plan import resolve_plan

ROOT = Path(__file__).resolve().parents[1]
FOUR = ["resources.actor.gpus=4", "resources.rollout.gpus=4", "resources.reference.gpus=4", "rollout.replicas=4"]


def _probe():
    """A Ray actor class standing in for a GPU process (defined here so Ray ships it by value to the workers)."""

    class Probe:
        def gpu(self):
            return [str(g) for g in ray.get_gpu_ids()], os.environ.get("CUDA_VISIBLE_DEVICES")

    return ray.remote(Probe)


def _bundle_gpu_left(pg, bundle: int) -> float:
    """GPU of bundle `bundle` of `pg` that no process has asked for yet (Ray's view; a spent resource is dropped)."""
    from ray._private import state

    (node,) = state.available_resources_per_node().values()  # one node
    return node.get(f"GPU_group_{bundle}_{pg.id.hex()}", 0.0)


def _eventually(check, timeout: float = 20.0) -> bool:
    """Ray's per-node resource view is refreshed asynchronously (the GCS syncs it from the raylet): poll it."""
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def gpu_ray():
    # logical CPUs: the colocate bundles ask 3 each (actor + reference + rollout cpus); a probe process idles
    with RaySession(num_cpus=12, num_gpus=4) as session:
        yield session


@pytest.mark.slow
def test_colocate_roles_share_one_group_of_four_gpus(gpu_ray):
    cfg = load_config(ROOT / "experiments/colocate/h800x16.yaml", FOUR)
    assert placement.gpu_roles(cfg) == ["rollout", "reference", "actor"] and placement.colocate_world(cfg) == 4
    share = placement.gpu_share(cfg, "actor")
    assert share == 0.3333 and 3 * share <= 1.0
    p = placement.Placement(cfg, timeout_s=60)
    probe = _probe()
    extra, probes = None, {}
    try:
        pg = p.group("actor")
        assert p.group("reference") is pg and p.group("rollout") is pg and len(p.groups) == 1
        assert len(pg.bundle_specs) == 4 and all(b["GPU"] == 1 for b in pg.bundle_specs)
        assert ray.available_resources().get("GPU", 0.0) == 0.0  # the group holds all 4 GPUs
        assert _eventually(lambda: [_bundle_gpu_left(pg, b) for b in range(4)] == [1.0] * 4), \
            [_bundle_gpu_left(pg, b) for b in range(4)]
        # Every role's GPU processes as `relax run` would place them: the Actor's and the Reference's Megatron ranks
        # 0..3 (rank 0 is the role's own process) and the rollout's SGLang engines 0..3, each on bundle = its index.
        opts = {(role, b): p.options(role, b) for role in ("actor", "reference", "rollout") for b in range(4)}
        assert sum(o["num_gpus"] for o in opts.values()) <= 4.0
        probes = {k: probe.options(**o).remote() for k, o in opts.items()}
        seen = dict(zip(probes, ray.get([a.gpu.remote() for a in probes.values()], timeout=60)))
        for b in range(4):  # all three roles admitted side by side on bundle b's one GPU
            ids = {seen[(role, b)][0][0] for role in ("actor", "reference", "rollout")}
            assert len(ids) == 1 and all(len(seen[(role, b)][0]) == 1 for role in ("actor", "reference", "rollout"))
        assert len({seen[("actor", b)][0][0] for b in range(4)}) == 4  # four bundles, four different GPUs
        # 3 x 0.3333 asked of each GPU
        assert _eventually(lambda: all(0.0 <= _bundle_gpu_left(pg, b) < share for b in range(4))), \
            [_bundle_gpu_left(pg, b) for b in range(4)]
        assert {seen[("rollout", b)][1] for b in range(4)} == {seen[("actor", b)][1] for b in range(4)}
        # A fourth role's process asking the same share on bundle 0 does not fit beside the three: Ray keeps it
        # waiting (the fractions are real admission bookkeeping, not a label) until one of them leaves that GPU.
        extra = probe.options(**placement.bundle_options(pg, 0, share, 0)).remote()
        ready, _ = ray.wait([extra.gpu.remote()], timeout=3)
        assert ready == []
        ray.kill(probes.pop(("rollout", 0)))
        assert ray.get(extra.gpu.remote(), timeout=60)[0] == seen[("actor", 0)][0]  # admitted to the freed share
    finally:
        if extra is not None:
            ray.kill(extra)
        for a in probes.values():
            ray.kill(a)
        p.release()


def test_async_roles_get_separate_groups_and_whole_gpus(gpu_ray):
    cfg = load_config(ROOT / "experiments/async/h800x16.yaml",
                      ["resources.actor.gpus=2", "resources.reference.gpus=2", "resources.actor_fwd.gpus=0",
                       "resources.actor_fwd.cpus=0"])
    assert not placement.colocated(cfg) and placement.gpu_share(cfg, "actor") == 1.0
    p = placement.Placement(cfg, timeout_s=60)
    probe = _probe()
    probes = {}
    try:
        actor_pg, ref_pg = p.group("actor"), p.group("reference")
        assert actor_pg.id != ref_pg.id and set(p.groups) == {"actor_pg", "reference_pg"}
        assert len(actor_pg.bundle_specs) == 2 and len(ref_pg.bundle_specs) == 2
        opts = {(role, b): p.options(role, b) for role in ("actor", "reference") for b in range(2)}
        assert all(o["num_gpus"] == 1 for o in opts.values())
        probes = {k: probe.options(**o).remote() for k, o in opts.items()}
        ids = [g for g, _ in ray.get([a.gpu.remote() for a in probes.values()], timeout=120)]
        assert all(len(g) == 1 for g in ids) and len({g[0] for g in ids}) == 4  # each process a GPU of its own
    finally:
        for a in probes.values():
            ray.kill(a)
        p.release()


def test_plan_prints_the_groups_the_supervisor_makes():
    colo = load_config(ROOT / "experiments/colocate/h800x16.yaml")
    plan = resolve_plan(colo)
    (pg,) = plan["placement_groups"]
    assert pg["bundles"] == placement.bundles(colo, "actor") and len(pg["bundles"]) == 16
    assert pg["bundles"][0] == {"GPU": 1, "CPU": 3}  # the three sharing roles' cpus
    assert all(r["gpu_fraction_per_bundle"] == placement.gpu_share(colo, r["role"])
               for r in plan["roles"] if r["gpus"] > 0)
    assert not any("planned, not built" in n for n in plan["notes"])
    asy = load_config(ROOT / "experiments/async/h800x16.yaml")
    for pg in resolve_plan(asy)["placement_groups"]:
        (role,) = pg["shared_by"]
        assert pg["name"] == placement.group_name(asy, role) and pg["bundles"] == placement.bundles(asy, role)
    # an engine of TP 2 cannot share 1-GPU bundles: the plan says so and the launcher refuses
    tp2 = load_config(ROOT / "experiments/colocate/h800x16.yaml", ["rollout.replicas=8"])
    assert any("TP 2" in p for p in resolve_plan(tp2)["problems"])
    with pytest.raises(ValueError, match="TP 2"):
        placement.process_options(tp2, "rollout", None, 0)


@pytest.mark.parametrize("message", ["The node with node id X timed out during startup",
                                     "Timed out waiting for file /tmp/relax-ray-x/session_1/gcs_server_port_ab"])
def test_a_head_process_slow_to_start_is_tried_again_and_other_errors_are_not(monkeypatch, message):
    """RaySession: a raylet or GCS server that did not come up in time (an overloaded host: CI saw the GCS port-file
    timeout on 2026-12-06) is tried again after shutting the attempt down; any other error of ray.init is raised at
    once."""
    import ray

    from relax import cluster

    calls, shutdowns = [], []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise RuntimeError(message)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    cluster.RaySession(num_cpus=1)._init_local()
    assert len(calls) == 2 and len(shutdowns) == 1

    calls.clear()
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw) or (_ for _ in ()).throw(ValueError("bad arg")))
    with pytest.raises(ValueError, match="bad arg"):
        cluster.RaySession(num_cpus=1)._init_local()
    assert len(calls) == 1
