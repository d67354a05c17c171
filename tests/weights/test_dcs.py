"""DCS (relax.weights): layouts, gloo transfers between Ray processes, peer recovery, pinning, the ledger."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import ray
import torch

from relax.weights import DCS, Staging, plan_layout

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def weights(seed: int, scale: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(64 * scale, 32, generator=g), "layer.0.w": torch.randn(32, 32, generator=g),
            "layer.0.b": torch.randn(32, generator=g), "norm.weight": torch.randn(32, generator=g).bfloat16(),
            "head.weight": torch.randn(100 * scale, 32, generator=g)}


def test_layout_groups_dtypes_and_respects_the_bucket_size():
    w = weights(0)
    layout = plan_layout(w, bucket_bytes=8 * 1024)
    for b in layout:
        assert len(b["entries"]) == 1 or b["bytes"] <= 8 * 1024
        assert {str(w[name].dtype).removeprefix("torch.") for name, *_ in b["entries"]} == {b["dtype"]}
    assert [e[0] for b in layout for e in b["entries"]] == list(w)  # every tensor once, in order
    assert len(plan_layout(w, bucket_bytes=2**30)) == 3  # float32 run, bfloat16, float32 again
    st = Staging(layout)
    st.fill(w, version=3)
    assert st.version == 3
    for k, v in st.views().items():
        assert torch.equal(v, w[k]) and v.dtype == w[k].dtype
    with pytest.raises(ValueError, match="bucket size"):
        plan_layout(w, 0)


@ray.remote(num_cpus=0)
class Member:
    """A stand-in role: joins the DCS, publishes or syncs, reports what it holds."""

    def __init__(self, dcs: DCS, role: str, serve=True, follow=False, trainer=False):
        self.dcs = dcs
        self.dcs.join(role, serve=serve, follow=follow, trainer=trainer)
        self.state, self.version = None, -1

    def pid(self):
        return os.getpid()

    def publish(self, version, seed, sample_ids=None):
        self.dcs.publish(version, weights(seed), sample_ids=sample_ids)
        self.version = version

    def sync(self, min_version=None, exact=None):
        def load(state, version):
            self.state = {k: v.clone() for k, v in state.items()}
            self.version = version

        self.dcs.sync(self.version, load, min_version=min_version, exact=exact)
        return self.version, self.dcs.last_transfer.get("src")

    def groups_made(self):
        return self.dcs.groups_made

    def equals(self, seed):
        return all(torch.equal(self.state[k], v) for k, v in weights(seed).items())


@pytest.fixture(scope="module", params=["gloo"])
def ray_session():
    from relax.cluster import RaySession

    with RaySession(num_cpus=4):
        yield


@pytest.fixture
def dcs(ray_session, request):
    d = DCS.start(getattr(request, "param", "gloo"), bucket_mb=0.004, timeout_s=20)  # ~4 KB: several buckets
    d.join("driver", serve=True, follow=True)
    d.publish(0, weights(0), pin=True)
    yield d
    d.close()


@pytest.mark.slow
def test_gloo_transfer_peer_recovery_pinning_and_ledger(dcs):
    trainer = Member.remote(dcs, "actor", trainer=True)
    assert ray.get(trainer.sync.remote(min_version=0))[0] == 0
    assert ray.get(trainer.equals.remote(0))
    ray.get(trainer.publish.remote(1, 1, sample_ids=[10, 11]))
    # Committed once another member (the driver follows every version) holds version 1.
    assert dcs.wait_committed(1, timeout=30)
    assert dcs.ledger() == [10, 11]

    rollout = Member.remote(dcs, "rollout")
    version, _ = ray.get(rollout.sync.remote(min_version=1))
    assert version == 1 and ray.get(rollout.equals.remote(1))

    # The reference asks for version 0 exactly, long after it was replaced: the driver pinned it.
    ray.get(trainer.publish.remote(2, 2, sample_ids=[12]))
    reference = Member.remote(dcs, "reference")
    assert ray.get(reference.sync.remote(exact=0))[0] == 0 and ray.get(reference.equals.remote(0))

    # The trainer dies: a newcomer gets the newest version from a live peer, not from the dead trainer.
    assert dcs.wait_committed(2, timeout=30)
    ray.get(rollout.sync.remote(min_version=2))
    trainer_id = next(m["id"] for m in dcs.topology()["members"] if m["role"] == "actor")
    os.kill(ray.get(trainer.pid.remote()), signal.SIGKILL)
    dcs.mark_dead(trainer_id)
    newcomer = Member.remote(dcs, "rollout")
    version, src = ray.get(newcomer.sync.remote(min_version=0))
    assert version == 2 and ray.get(newcomer.equals.remote(2))
    assert not src.startswith("actor")
    topo = dcs.topology()
    assert topo["reachable"] == 2 and topo["stats"]["transfers"] >= 5
    assert dcs.ledger() == [10, 11, 12]
    for a in (rollout, reference, newcomer):
        ray.kill(a)


@pytest.mark.parametrize("reuse", [True, False])
def test_a_pair_reuses_its_process_group_across_versions(ray_session, reuse):
    d = DCS.start("gloo", bucket_mb=0.004, timeout_s=20, reuse_groups=reuse)
    try:
        d.join("driver", serve=False)
        trainer = Member.remote(d, "actor", trainer=True)
        rollout = Member.remote(d, "rollout", serve=False)
        for v in range(4):
            ray.get(trainer.publish.remote(v, v))
            version, src = ray.get(rollout.sync.remote(min_version=v))
            assert version == v and src.startswith("actor") and ray.get(rollout.equals.remote(v))
        # Four versions, several buckets each, one group per pair when reused; a group per transfer otherwise.
        assert ray.get(rollout.groups_made.remote()) == (1 if reuse else 4)
        assert ray.get(trainer.groups_made.remote()) == (1 if reuse else 4)
        assert d.topology()["stats"]["transfers"] == 4
        for a in (trainer, rollout):
            ray.kill(a)
    finally:
        d.close()


@pytest.mark.slow
def test_uncommitted_version_rolls_back_with_its_samples_when_the_trainer_dies(ray_session):
    d = DCS.start("gloo", bucket_mb=1, timeout_s=20)
    try:
        d.join("driver", serve=True, follow=False)  # no follower: nothing replicates version 1
        d.publish(0, weights(0), pin=True)
        trainer = Member.remote(d, "actor", trainer=True)
        ray.get(trainer.sync.remote(min_version=0))
        ray.get(trainer.publish.remote(1, 1, sample_ids=[1, 2, 3]))
        assert not d.wait_committed(1, timeout=0.5)
        trainer_id = next(m["id"] for m in d.topology()["members"] if m["role"] == "actor")
        ray.kill(trainer)
        d.mark_dead(trainer_id)
        topo = d.topology()
        assert topo["latest"] == 0 and topo["reachable"] == 0
        assert d.ledger() == []
        # A new trainer resumes from version 0 and may publish version 1 again.
        again = Member.remote(d, "actor", trainer=True)
        assert ray.get(again.sync.remote(min_version=0))[0] == 0
        ray.get(again.publish.remote(1, 5, sample_ids=[1, 2, 3]))
        ray.kill(again)
    finally:
        d.close()


def _durable_driver_and_two_versions(d: DCS):
    """This process joins `d` as the durable driver (version 0 pinned); a trainer publishes version 1, which the
    driver pulls (committed), then version 2, which nobody else holds yet. Returns the trainer."""
    d.join("driver", serve=True, follow=False, durable=True)
    d.publish(0, weights(0), pin=True)
    trainer = Member.remote(d, "actor", trainer=True)
    ray.get(trainer.sync.remote(min_version=0))
    ray.get(trainer.publish.remote(1, 1, sample_ids=[1]))
    assert d.latest_state(min_version=1)[0] == 1 and d.wait_committed(1, timeout=30)  # the driver holds it
    ray.get(trainer.publish.remote(2, 2, sample_ids=[2]))
    return trainer


@pytest.mark.slow
def test_only_the_durable_driver_commits_and_a_global_restart_rolls_back_what_died_with_the_roles(ray_session):
    """A version the rollout holds but the driver (durable) does not is not committed; when the trainer dies and
    then the rollout too (a global restart stopping every role), it is gone: latest falls back to the driver's
    version, its samples leave no ledger entry, and a new trainer may publish that version again."""
    d = DCS.start("gloo", bucket_mb=1, timeout_s=20)
    try:
        trainer = _durable_driver_and_two_versions(d)
        rollout = Member.remote(d, "rollout")
        assert ray.get(rollout.sync.remote(min_version=2))[0] == 2
        assert not d.wait_committed(2, timeout=0.5)  # a role's copy does not commit
        ids = {m["role"]: m["id"] for m in d.topology()["members"]}
        ray.kill(trainer)
        d.mark_dead(ids["actor"])
        assert d.topology()["latest"] == 2  # the rollout still holds version 2
        ray.kill(rollout)
        d.mark_dead(ids["rollout"])
        topo = d.topology()
        assert topo["latest"] == topo["reachable"] == 1 and d.ledger() == [1]
        again = Member.remote(d, "actor", trainer=True)
        assert ray.get(again.sync.remote(min_version=0))[0] == 1
        ray.get(again.publish.remote(2, 5, sample_ids=[2]))  # version 2 again, from the restarted trainer
        assert d.latest_state(min_version=2)[0] == 2 and d.wait_committed(2, timeout=30) and d.ledger() == [1, 2]
        ray.kill(again)
    finally:
        d.close()


@pytest.mark.slow
def test_the_durable_driver_keeps_its_version_while_a_newer_one_fails_to_arrive(ray_session):
    """The driver's copy is what a global restart resumes from: it receives version 2 into a second buffer and
    serves version 1 until 2 is whole. A holder dying mid-transfer leaves it holding 1 (a single buffer would
    have released 1 first, leaving only the pin, and a restart would resume from 0 with partitions gone)."""
    d = DCS.start("gloo", bucket_mb=1, timeout_s=5)
    try:
        trainer = _durable_driver_and_two_versions(d)
        real, seen = d._pairs.receive, {}

        def dies_mid_transfer(sess, buffers):
            real(sess, buffers)
            topo = d.topology()
            seen["holds"] = next(m["holds"] for m in topo["members"] if m["role"] == "driver")
            raise RuntimeError("the holder died mid-transfer")

        d._pairs.receive = dies_mid_transfer
        with pytest.raises((RuntimeError, TimeoutError)):
            d._pull(2, None, timeout=1.0)  # the only holder is excluded after its failure: nobody else has 2
        d._pairs.receive = real
        assert 1 in seen["holds"], seen  # served all along
        ids = {m["role"]: m["id"] for m in d.topology()["members"]}
        ray.kill(trainer)
        d.mark_dead(ids["actor"])
        assert d.topology()["reachable"] == 1 and d.ledger() == [1]
        version, state = d.latest_state(min_version=1)
        assert version == 1 and all(torch.equal(state[k], v) for k, v in weights(1).items())
    finally:
        d.close()


@pytest.mark.slow
def test_a_busy_holder_is_asked_again_not_dropped(ray_session):
    """The driver's serve thread is stuck sending to a receiver that died (until that transfer times out), so it
    takes no new session for a while. A Reference that needs version 0, which only the driver holds, waits for it
    and gets it, instead of striking the driver off and failing (the kill-every-role loop's 22nd run)."""
    import threading
    import time

    d = DCS.start("gloo", bucket_mb=1, timeout_s=2)  # a holder has 2 s to take a session
    try:
        d.join("driver", serve=True, follow=False, durable=True)
        d.publish(0, weights(0), pin=True)
        real, stuck = d._pairs.send, threading.Event()

        def send_to_a_dying_receiver_first(sess, buffers):
            if not stuck.is_set():
                stuck.set()
                time.sleep(6)  # longer than a session's accept window: the holder looks gone
                raise RuntimeError("the receiver died")
            return real(sess, buffers)

        d._pairs.send = send_to_a_dying_receiver_first
        doomed = Member.remote(d, "rollout", serve=False)
        doomed.sync.remote(exact=0)  # its transfer is the one that hangs
        assert stuck.wait(30)
        reference = Member.remote(d, "reference", serve=False)
        version, src = ray.get(reference.sync.remote(exact=0), timeout=60)
        assert version == 0 and src.startswith("driver") and ray.get(reference.equals.remote(0))
        for a in (doomed, reference):
            ray.kill(a)
    finally:
        d.close()


@pytest.mark.slow
def test_object_store_transport_has_the_same_interface(ray_session):
    d = DCS.start("object_store")
    try:
        d.join("driver")
        d.publish(0, weights(0))
        trainer = Member.remote(d, "actor", trainer=True)
        assert ray.get(trainer.sync.remote(min_version=0))[0] == 0
        ray.get(trainer.publish.remote(1, 1, sample_ids=[7]))
        rollout = Member.remote(d, "rollout")
        assert ray.get(rollout.sync.remote(min_version=1))[0] == 1 and ray.get(rollout.equals.remote(1))
        assert d.ledger() == [7]
        version, state = d.latest_state(min_version=1)
        assert version == 1 and torch.equal(state["head.weight"], weights(1)["head.weight"])
        for a in (trainer, rollout):
            ray.kill(a)
    finally:
        d.close()


def test_staging_on_a_gpu_selects_nccl_through_the_same_code():
    import torch.distributed as dist

    from relax.weights.transport import make_pair_group

    if getattr(dist, "ProcessGroupNCCL", None) is not None:
        pytest.skip("this torch build has NCCL; the pairing is checked on GPU machines")
    with pytest.raises(RuntimeError, match="no NCCL"):
        make_pair_group(dist.HashStore(), "s", 0, 5.0, "cuda", "127.0.0.1")


def test_leaving_wakes_a_members_long_polls(ray_session):
    """A serving and a following long poll wait for news up to their timeout (client.POLL_S); `wake` (sent by
    `leave`) answers both at once, so a member leaves without waiting out its polls. The polls here ask for 120 s."""
    d = DCS.start("gloo")
    try:
        mid = d.join("driver", serve=False, follow=False)
        serving = d.coord.next_session.remote(mid, 120.0)
        following = d.coord.wait_newer.remote(5, 120.0, mid)
        assert ray.wait([serving, following], num_returns=2, timeout=1.0)[0] == []  # both wait: no news yet
        ray.get(d.coord.wake.remote(mid))
        assert ray.get(serving, timeout=60) is None  # nothing to serve
        assert ray.get(following, timeout=60) == 5  # no newer version than the one it has
    finally:
        d.close()
