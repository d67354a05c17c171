"""Fault injection and recovery (relax.fault): signals, the rollout work queue, and real kills in live runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relax.api.pool import GroupQueue
from relax.config import ConfigError, FaultSpec, load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rollout.prompts_per_step=4", "rollout.group_size=4", "warmup.steps=20", "task.eval_size=8",
        "health.stall_timeout_s=240",  # a hang fails in minutes with a stall report (relax/fault/stall.py)
        "rollout.chunk_groups=1"]


def proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]


def becomes(pid: int, stopped: bool, timeout: float = 3.0) -> bool:
    """Signals land asynchronously: wait for the process to be stopped (T) or not."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (proc_state(pid) == "T") == stopped:
            return True
        time.sleep(0.005)
    return False


def test_injector_kills_stops_and_slows_real_processes():
    from relax.fault.inject import FaultInjector

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        specs = [FaultSpec(role="reward", at_step=1, kind="kill"),
                 FaultSpec(role="reference", at_step=0, kind="delay", duration_s=0.6),
                 FaultSpec(role="advantages", at_step=0, kind="slow", duration_s=30, duty=0.5)]
        pids = dict(zip(["reward", "reference", "advantages"], [p.pid for p in procs]))
        inj = FaultInjector(specs, lambda spec: pids[spec.role])
        fired = inj.tick(steps_done=0)
        assert [f["kind"] for f in fired] == ["delay", "slow"]  # the kill waits for step 1
        assert becomes(pids["reference"], stopped=True)
        assert becomes(pids["advantages"], stopped=True)  # stopped part of the time,
        assert becomes(pids["advantages"], stopped=False)  # running the rest
        assert [f["kind"] for f in inj.tick(steps_done=1)] == ["kill"]
        assert procs[0].wait(5) == -9
        assert becomes(pids["reference"], stopped=False)  # the delay ended
        inj.stop()  # ends the slow fault and resumes whatever it stopped
        assert becomes(pids["advantages"], stopped=False)
        time.sleep(0.3)
        assert proc_state(pids["advantages"]) != "T"
        assert inj.tick(steps_done=5) == []  # each fault fires once
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_group_queue_reissues_a_dead_replicas_claims_and_drains():
    q = GroupQueue.__ray_actor_class__(steps=2, prompts_per_step=4, chunk_groups=2)
    run = asyncio.run
    a = run(q.claim(0, upto=0))
    b = run(q.claim(1, upto=0))
    assert (a["step"], a["groups"], b["groups"]) == (0, [0, 1], [2, 3])
    assert run(q.claim(1, upto=0)) == {"next": True}  # partition 0 is all handed out
    run(q.putting(a["cid"]))  # replica 0 dies while putting its claim, replica 1 before
    assert run(q.release(0)) == 1
    c = run(q.claim(1, upto=1))  # re-issued work comes first, and says it may already be on the bus
    assert (c["step"], c["groups"], c["maybe_put"]) == (0, [0, 1], True)
    run(q.finish(c["cid"], 2))
    run(q.finish(b["cid"], 2))
    d = run(q.claim(1, upto=1))
    assert (d["step"], d["groups"], d["maybe_put"]) == (1, [0, 1], False)
    run(q.drain(1))
    assert run(q.claim(1, upto=1)) == {"stop": True}  # draining: no new work, the open claim finishes
    run(q.finish(d["cid"], 2))
    e = run(q.claim(2, upto=1))
    assert run(q.claim(3, upto=1)) == {"wait": True}  # last work is out with replica 2
    run(q.finish(e["cid"], 2))
    assert run(q.claim(3, upto=1)) == {"stop": True}
    assert run(q.stats())["generated_groups"] == {1: 6, 2: 2}


def test_group_queue_never_hands_out_a_partition_past_the_run():
    """A replica whose loop asks past the last partition (upto >= steps) gets no work of a partition the run never
    trains: 'wait' while others hold the last open work, then 'stop'."""
    q = GroupQueue.__ray_actor_class__(steps=2, prompts_per_step=2, chunk_groups=2)
    run = asyncio.run
    a, b = run(q.claim(0, upto=1)), run(q.claim(0, upto=1))
    assert (a["step"], b["step"]) == (0, 1)
    assert run(q.claim(1, upto=2)) == {"wait": True} and run(q.claim(1, upto=5)) == {"wait": True}
    run(q.finish(a["cid"], 2))
    run(q.finish(b["cid"], 2))
    assert run(q.claim(1, upto=2)) == {"stop": True}


def test_an_armed_replica_is_held_mid_put_until_its_kill_releases_it(monkeypatch):
    """GroupQueue.wait_held arms a replica: its next claim's first put reports it (`putting` is True), and `landed`
    then holds it there, cut mid-put, until `release` (its death) or MID_PUT_HOLD_S; other replicas never wait."""
    from relax.api import pool

    q = GroupQueue.__ray_actor_class__(steps=2, prompts_per_step=8, chunk_groups=2)

    async def scenario():
        a, b = await q.claim(0, upto=0), await q.claim(1, upto=0)
        assert await q.putting(b["cid"]) is False  # nothing armed: no hold, no extra call
        t0 = time.monotonic()
        assert await q.wait_held(1, 0.05) is False and time.monotonic() - t0 >= 0.05
        waiter = asyncio.ensure_future(q.wait_held(1, 30.0))
        assert await q.putting(a["cid"]) is False  # replica 0 is not armed
        await asyncio.wait_for(q.landed(a["cid"]), 1.0)
        c = await q.claim(1, upto=0)
        assert await q.putting(c["cid"]) is True
        held = asyncio.ensure_future(q.landed(c["cid"]))
        assert await asyncio.wait_for(waiter, 5.0) is True
        assert await q.wait_held(1, 30.0) is True and not held.done()  # still held: the kill can come any time
        assert await q.partly_put(1) == 2  # both claims of replica 1 have begun putting
        assert await q.release(1) == 2
        await asyncio.wait_for(held, 1.0)  # its death lets the hold go
        d = await q.claim(1, upto=0)
        assert await q.putting(d["cid"]) is False  # released: no longer armed

        monkeypatch.setattr(pool, "MID_PUT_HOLD_S", 0.05)
        assert await q.wait_held(0, 0.01) is False
        e = await q.claim(0, upto=1)
        assert await q.putting(e["cid"]) is True
        t0 = time.monotonic()
        await asyncio.wait_for(q.landed(e["cid"]), 5.0)  # no kill came: it goes on after the hold...
        assert time.monotonic() - t0 >= 0.05
        f = await q.claim(0, upto=1)
        assert await q.putting(f["cid"]) is True  # ...and stays armed for its next claim

    asyncio.run(scenario())


def test_a_mid_put_kill_stops_holding_the_actor_once_its_replica_has_had_no_claim_for_a_while(monkeypatch):
    """Supervisor._released: a due mid_put kill whose replica holds no open claim for MID_PUT_RELEASE_S stops
    holding the Actor, once; a claim in between starts the wait over; kills not due, or not mid_put, never count."""
    from types import SimpleNamespace

    from relax.fault import supervisor as sv

    clock, claims = [100.0], {0: True, 1: False}
    monkeypatch.setattr(sv.time, "time", lambda: clock[0])
    monkeypatch.setattr(sv.ray, "get", lambda x: x)  # the fake queue answers at once

    def kill(index, replica, at_step, mid_put=True):
        return {"index": index, "spec": SimpleNamespace(mid_put=mid_put, at_step=at_step, replica=replica)}
    queue = SimpleNamespace(open_claims=SimpleNamespace(remote=lambda replica: claims[replica]))
    sup = SimpleNamespace(queue=queue, released=set(), claimless_since={}, injector=SimpleNamespace(
        waiting=[kill(0, 0, 2), kill(1, 1, 2), kill(2, 1, 2, mid_put=False), kill(3, 1, 5)]))

    def released(step):
        return sv.Supervisor._released(sup, step)
    wait = sv.MID_PUT_RELEASE_S
    assert released(2) == []  # replica 1 has no claim: its wait starts now
    clock[0] += wait * 0.9
    assert released(2) == []
    clock[0] += wait * 0.2
    assert released(2) == [1]  # kill 0's replica holds a claim; kill 2 is not mid_put; kill 3 is not due
    assert released(2) == []  # released once
    claims[0] = False
    assert released(3) == []  # kill 0's wait starts
    claims[0] = True
    clock[0] += wait * 0.9
    assert released(3) == []  # a claim opens: the wait is over...
    claims[0] = False
    assert released(3) == []  # ...and starts again
    clock[0] += wait * 0.9
    assert released(3) == []  # 1.8 waits since it first started, 0.9 since the claim
    clock[0] += wait * 0.2
    assert released(5) == [0]  # kill 3 is due now: its wait starts
    clock[0] += wait * 1.1
    assert released(5) == [3]


def test_fault_config_is_checked():
    base = ROOT / "experiments/async/cpu.yaml"
    with pytest.raises(ConfigError, match="faults.0.at_step"):
        load_config(base, ["steps=3", "faults=[{role: actor, at_step: 3}]"])
    with pytest.raises(ConfigError, match="faults.0.replica"):
        load_config(base, ["faults=[{role: rollout, at_step: 1, replica: 1}]"])
    with pytest.raises(ConfigError, match="dcs.transport"):
        load_config(base, ["dcs.transport=object_store", "faults=[{role: actor, at_step: 1}]"])
    with pytest.raises(ConfigError, match="faults.0.kind"):
        load_config(base, ["faults=[{role: actor, at_step: 1, kind: explode}]"])
    with pytest.raises(ConfigError, match="needs mode 'async'"):
        load_config(ROOT / "experiments/colocate/cpu.yaml", ["faults=[{role: reward, at_step: 1}]"])
    with pytest.raises(ConfigError, match="faults.0.kind: 'nan'"):
        load_config(base, ["faults=[{role: reward, at_step: 1, kind: nan}]"])
    with pytest.raises(ConfigError, match="faults.0.after_s"):
        load_config(base, ["faults=[{role: actor, at_step: 1, kind: nan, after_s: 1}]"])
    with pytest.raises(ConfigError, match="faults.0.mid_put"):
        load_config(base, ["faults=[{role: actor, at_step: 1, mid_put: true}]"])
    with pytest.raises(ConfigError, match="training.max_nonfinite_steps"):
        load_config(base, ["training.max_nonfinite_steps=0"])
    cfg = load_config(base, ["faults=[{role: rollout, at_step: 2, kind: slow, duty: 0.5}]", "max_global_restart=2"])
    assert cfg.faults[0].kind == "slow" and cfg.max_global_restart == 2


def assert_one_event_per_kill(rec: dict) -> None:
    """Exactly one recovery event per killed process, and each names the process and its fault."""
    kills = [f for f in rec["faults"] if f["kind"] == "kill"]
    events = [e for e in rec["events"] if "tier" in e]
    assert sorted(e["pid"] for e in events) == sorted(f["pid"] for f in kills), (kills, events)
    for e in events:
        f = next(f for f in kills if f["pid"] == e["pid"])
        assert (e["role"], e["replica"]) == (f["role"], f["replica"]) and e["t_fault"] == f["t_fault"], (e, f)


@pytest.mark.slow
def test_killing_every_role_at_once_records_one_event_per_fault(tmp_path):
    """Five kills in the same instant: the Actor's global restart brings all back; each kill has its own event
    (those seen beside the Actor's, or found dead as the restart stops the world, are marked superseded)."""
    from relax.config import load_config as load
    from relax.controller import run_experiment

    roles = ["rollout", "reward", "reference", "advantages", "actor"]
    faults = "faults=[" + ", ".join(f"{{role: {r}, at_step: 2, kind: kill}}" for r in roles) + "]"
    cfg = load(ROOT / "experiments/async/cpu.yaml", [*TINY, "steps=4", faults])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    assert summary["samples_trained"] == 4 * 16
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run_dir / "recovery.json").read_text())
    assert sorted(f["role"] for f in rec["faults"]) == sorted(roles) and rec["global_restarts"] == 1
    assert_one_event_per_kill(rec)
    events = [e for e in rec["events"] if "tier" in e]
    actor = next(e for e in events if e["role"] == "actor")
    killed = {f["pid"] for f in rec["faults"]}
    assert actor["tier"] == 2 and actor["ready_s"] > 0 and not killed & set(actor["stopped_pids"]), actor
    assert all(e.get("superseded_by_global_restart") or e["ready_s"] > 0 for e in events), events


@pytest.mark.slow
def test_a_replica_killed_mid_put_loses_and_repeats_no_sample(tmp_path):
    """Request-level streaming (rollout.max_inflight): a replica puts each group as its last sample ends. The kill
    lands as a put of replica 1 begins (`mid_put`: the GroupQueue tells the supervisor the moment the claim is flagged
    putting), so the GroupQueue must hand the claim out again flagged maybe_put, and the replica that takes it
    generates only the groups not on the bus. Every sample is trained exactly once."""
    from relax.config import load_config as load
    from relax.controller import run_experiment

    faults = "faults=[{role: rollout, replica: 1, at_step: 1, kind: kill, mid_put: true}]"
    cfg = load(ROOT / "experiments/async/cpu.yaml", [*TINY, "steps=5", "rollout.replicas=2", "rollout.chunk_groups=2",
                                                      "rollout.max_inflight=8", faults])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    assert summary["samples_trained"] == 5 * 16
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run_dir / "recovery.json").read_text())
    assert_one_event_per_kill(rec)
    events = [e for e in rec["events"] if "tier" in e]
    assert [(e["role"], e["replica"], e["tier"]) for e in events] == [("rollout", 1, 1)]
    assert events[0]["claims_cut_mid_put"] >= 1 and events[0]["claims_returned"] >= 1, events[0]


@pytest.mark.slow
def test_killing_every_role_mid_run_loses_and_repeats_no_sample(tmp_path):
    from relax.config import load_config as load
    from relax.controller import run_experiment

    # The rollout is slowed first so that its kill is likely to cut a generation in flight.
    faults = ("faults=[{role: rollout, at_step: 0, kind: slow, duration_s: 3, duty: 0.3},"
              " {role: rollout, at_step: 1, kind: kill, after_s: 0.3}, {role: reward, at_step: 2, kind: kill},"
              " {role: reference, at_step: 3, kind: kill}, {role: advantages, at_step: 4, kind: kill},"
              " {role: actor, at_step: 5, kind: kill}]")
    cfg = load(ROOT / "experiments/async/cpu.yaml", [*TINY, "steps=7", faults])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    assert summary["samples_trained"] == 7 * 16
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run_dir / "recovery.json").read_text())
    # Every step trained; only a row the killed Actor had not yet reported may be missing, and the report names it.
    rows_lost = [k for e in rec["events"] for k in e.get("metrics_rows_lost", [])]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(steps + rows_lost) == list(range(7)) and summary["steps"] == 7 - len(rows_lost)
    killed = {(f["role"]) for f in rec["faults"] if f["kind"] == "kill"}
    assert killed == {"rollout", "reward", "reference", "advantages", "actor"}
    # Each fault fired in the step it names (the Actor's own counter; it waits for a fault due before its next step).
    assert all(f["steps_done"] == f["at_step"] for f in rec["faults"]), rec["faults"]
    assert_one_event_per_kill(rec)
    tiers = {e["role"]: e["tier"] for e in rec["events"]}
    assert tiers == {"rollout": 1, "reward": 1, "reference": 1, "advantages": 1, "actor": 2}
    for e in rec["events"]:
        assert 0 <= e["detect_s"] < 10
        if e.get("superseded_by_global_restart"):  # the Actor's global restart came first
            continue
        assert e["ready_s"] > 0
        if e["role"] in ("rollout", "reference", "actor"):
            assert e["dcs_bytes"] > 0 and not e["dcs_src"].startswith("actor")  # weights from a live peer
    ref = next(e for e in rec["events"] if e["role"] == "reference")
    assert ref.get("superseded_by_global_restart") or ref["dcs_version"] == 0  # the reference policy, long after the trainer moved on
    actor = next(e for e in rec["events"] if e["role"] == "actor")
    assert actor["resumed_version"] == actor["resume_step"] and actor["checkpoint_version"] is not None
    assert rec["global_restarts"] == 1


def test_the_stall_limit_grows_with_the_slowest_step():
    from relax.fault.stall import stall_limit

    assert stall_limit(600, {}) == 600  # no step yet: the configured timeout
    assert stall_limit(600, {0: {"step_time_s": 100}, 1: {"step_time_s": 300}}) == 900  # 3x the slowest step
    assert stall_limit(600, {0: {"step_time_s": None}}) == 600


@pytest.mark.slow
def test_a_stalled_run_fails_with_a_report_of_where_every_role_waits(tmp_path):
    """Reward stopped (SIGSTOP) and never killed (heartbeat timeout out of reach): no step can finish, and the run
    fails after health.stall_timeout_s naming stall.txt, which shows the bus state and every role's stack."""
    from relax.controller import run_experiment

    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [
        *TINY, "steps=4", "health.heartbeat_timeout_s=1000", "health.stall_timeout_s=10",
        "faults=[{role: reward, at_step: 1, kind: delay, duration_s: 600}]"])
    with pytest.raises(RuntimeError, match="the run stalled: no step finished for") as err:
        run_experiment(cfg, out=tmp_path, progress=False)
    report = Path(str(err.value).rsplit(": ", 1)[1])
    assert report.name == "stall.txt" and report.parent.parent.parent.parent == tmp_path
    text = report.read_text()
    for section in ("== progress", "== staleness gate", "== group queue", "== bus", "== py-spy reward (pid",
                    "== py-spy actor (pid", "== py-spy rollout-0 (pid"):
        assert section in text, section
    # the partition Reward stopped in: every row's response exists, Reward has written fewer rewards than that
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("reward ")]
    ready = [int(r[2].split("=")[1]) for r in rows]
    written = [int(r[4].split("=")[1]) for r in rows]
    assert any(w < n for w, n in zip(written, ready)), rows
    assert "MainThread" in text  # a py-spy stack (of a running role) made it into the report
    assert json.loads((report.parent / "status.json").read_text())["state"] == "failed"


def test_a_global_restart_waits_for_every_stopped_process_to_exit(local_ray):
    """ray.kill only asks; a stopped role still running could fetch rows after their redelivery (the hang once
    seen in kill-every-role). wait_exited returns once the process is gone, and fails on one that stays."""
    import os

    import ray

    from relax.fault.heartbeat import exited, wait_exited

    @ray.remote(num_cpus=0)
    class Busy:
        def pid(self):
            return os.getpid()

        def block(self):
            time.sleep(120)

    a, b, c = Busy.remote(), Busy.remote(), Busy.remote()
    pids = ray.get([h.pid.remote() for h in (a, b, c)])
    a.block.remote(), b.block.remote()  # killed inside a call, as a role in its run() loop is
    ray.kill(a), ray.kill(b)
    wait_exited([(pids[0], a), (None, b)])  # by pid (one node), and by handle alone (a role on another node)
    assert exited(pids[0])
    with pytest.raises(RuntimeError, match=f"pid {pids[2]}"):
        wait_exited([(pids[2], c)], timeout=0.5)  # never killed: still running
    assert not exited(pids[2])


@pytest.mark.slow
def test_redelivery_hands_unwritten_rows_out_again_and_skips_written_ones(local_ray):
    import torch

    from relax.bus import Bus
    from relax.config import BusConfig
    from relax.fault.redelivery import existing_groups, live_partitions, produced, redeliver, waiting
    from relax.fault.stall import task_state

    bus = Bus.start(BusConfig(capacity_rows=64), group_size=2, max_staleness=1)
    try:
        rows = {"sample_id": torch.arange(6), "group_id": torch.tensor([0, 0, 1, 1, 2, 2]),
                "response_ids": [torch.arange(n + 1) for n in range(6)]}
        bus.put_rows(0, rows)
        assert live_partitions(bus) == [0] and existing_groups(bus, 0) == {0, 1, 2} and existing_groups(bus, 1) == set()
        # queue depth: all 6 wait for reward; nothing for advantages, whose input (rewards) is not written yet
        assert waiting(bus, 0, "reward", ["response_ids"]) == 6 and waiting(bus, 0, "advantages", ["rewards"]) == 0
        assert bus.fetch(0, "reward", ["response_ids"], max_rows=2).size == 2
        assert waiting(bus, 0, "reward", ["response_ids"]) == 4
        redeliver(bus, "reward", 0)
        got = bus.fetch(0, "reward", ["response_ids"], max_rows=6)
        assert got.size == 6 and waiting(bus, 0, "reward", ["response_ids"]) == 0
        # The role writes rewards for two rows, then dies: the other four are consumed but never written.
        first = got.select([0, 1])
        bus.write(first, {"rewards": torch.tensor([1.0, 0.0])})
        assert waiting(bus, 0, "advantages", ["rewards"]) == 2
        assert bus.fetch(0, "reward", ["response_ids"], max_rows=6) is None  # lost to the task without redelivery
        done = produced(bus, 0, ["rewards"])
        assert done == set(first.indexes)
        # what a stall report shows for it (relax/fault/stall.py)
        assert task_state(bus, 0, "reward", ["response_ids"], ["rewards"]) == {
            "input_ready": 6, "fetched": 6, "written": 2, "fetched_not_written": sorted(set(got.indexes) - done)}
        assert redeliver(bus, "reward", 0) == [0]
        again = bus.fetch(0, "reward", ["response_ids"], max_rows=6)
        todo = [g for g in again.indexes if g not in done]
        assert sorted(todo) == sorted(set(got.indexes) - done)
    finally:
        bus.close()


def _fake_run(run_dir: Path) -> None:
    """A hand-made run: steps of 1 s, 3 s while a rollout replica was down (fault at 4.5 s), then 1 s again."""
    run_dir.mkdir(parents=True)
    times = [1, 1, 1, 1, 3, 3, 1, 1, 1, 1]
    wall, rows = 0.0, []
    for k, t in enumerate(times):
        wall += t
        rows.append({"step": k, "wall_time_s": wall, "step_time_s": t})
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ev = {"role": "rollout", "replica": 1, "tier": 1, "t_fault": 4.5, "t_detect": 4.7, "detect_s": 0.2,
          "t_ready": 8.0, "ready_s": 3.5, "steps_done_at_detect": 4, "dcs_seconds": 0.01, "dcs_bytes": 100,
          "boot": {"spawn": 0.5, "imports": 2.0}}
    (run_dir / "recovery.json").write_text(json.dumps({"events": [ev], "faults": []}))
    (run_dir / "summary.json").write_text(json.dumps({"samples_lost": 0, "samples_duplicated": 0}))
    gen = [(1, 0.5, 1.0), (1, 4.0, 0.4), (1, 8.5, 1.0), (0, 8.0, 0.2)]  # (replica, start s, duration s)
    (run_dir / "trace.json").write_text(json.dumps({"traceEvents": [
        {"name": "generate", "ph": "X", "ts": s * 1e6, "dur": d * 1e6, "args": {"replica": r}} for r, s, d in gen]}))


def test_recovery_report_separates_detect_ready_serving_and_throughput(tmp_path):
    from analysis.recovery import draw_recovery, table

    _fake_run(tmp_path / "run")
    (row,) = table(tmp_path / "run")
    assert (row["detect_s"], row["ready_s"]) == (0.2, 3.5)
    assert row["serving_s"] == pytest.approx(9.5 - 4.5)  # the replacement's first groups after it was ready
    # Three steps averaging within 1.25x of the pre-fault median start at step 6 (ends at 11 s): 6.5 s after the
    # fault, later than serving, so that is the time back to the previous throughput.
    assert row["throughput_s"] == pytest.approx(11 - 4.5)
    res = {"cpus": 2, "cold": {"run": "run", "overrides": [], "rows": [row | {"setting": "cold"}], "steps": 10,
                               "samples_lost": 0, "samples_duplicated": 0, "load_before": 1, "load_after": 1,
                               "wall_s": 1}}
    (tmp_path / "recovery").mkdir()
    (tmp_path / "recovery" / "recovery.json").write_text(json.dumps(res))
    files = draw_recovery(tmp_path, tmp_path / "figs", tmp_path / "tables")
    assert [f.name for f in files] == ["recovery.png", "recovery.md", "recovery.csv"]
    md = (tmp_path / "tables" / "recovery.md").read_text()
    assert "publishes no recovery timings" in md and "| cold | rollout-1 | 1 |" in md and "imports 2.00" in md
    assert draw_recovery(tmp_path / "empty", tmp_path / "figs", tmp_path / "tables") == []


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_enough_in_a_row_stop_the_run(tmp_path):
    """`nan` faults make the Actor's loss NaN at steps 1, 3 and 4: each is skipped (no update) and says so; the
    second in a row (training.max_nonfinite_steps=2) stops the run with a clear error, and what it did is written:
    every sample of the steps that ran is accounted (those of skipped steps as reported), none lost."""
    import math

    from relax.config import load_config as load
    from relax.controller import RunStopped, run_experiment

    faults = "faults=[{role: actor, at_step: 1, kind: nan}, {role: actor, at_step: 3, kind: nan}, " \
             "{role: actor, at_step: 4, kind: nan}]"
    cfg = load(ROOT / "experiments/async/cpu.yaml", [*TINY, "steps=7", "training.max_nonfinite_steps=2", faults])
    with pytest.raises(RunStopped, match=r"2 steps in a row \(steps 3\.\.4\).*max_nonfinite_steps=2") as err:
        run_experiment(cfg, out=tmp_path, progress=False)
    run_dir = err.value.run_dir
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["skipped_nonfinite"] for r in rows] == [0, 1, 0, 1, 1]
    assert all(math.isfinite(r["loss"]) == (not r["skipped_nonfinite"]) for r in rows), rows
    assert all(math.isfinite(r["grad_norm"]) == (not r["skipped_nonfinite"]) for r in rows), rows
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "max_nonfinite_steps=2" in summary["error"] and summary["steps"] == 5 and summary["steps_planned"] == 7
    assert summary["steps_skipped_nonfinite"] == 3 and summary["samples_skipped_nonfinite"] == 3 * 16
    assert summary["samples_trained"] == 5 * 16 and summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    from relax.run_folder import RunFolder, latest_runs

    # stopped, not finished: figures and reports that take the newest finished run never pick it
    assert RunFolder(run_dir).stopped and not RunFolder(run_dir).complete and latest_runs(tmp_path) == {}
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    rec = json.loads((run_dir / "recovery.json").read_text())
    assert [(f["kind"], f["at_step"], f["steps_done"]) for f in rec["faults"]] == [("nan", 1, 1), ("nan", 3, 3),
                                                                                 ("nan", 4, 4)]


def _live_role_pids(sup) -> dict[int, str]:
    """pid -> role of every role process the supervisor runs now (read from the run's own supervisor)."""
    for _ in range(50):
        try:
            out = {pid: name for name, pid in list(sup.pids.items()) if pid is not None}
            out.update({r.pid: "rollout" for r in sup.pool.snapshot().values() if r.status == "ACTIVE" and r.pid})
            return out
        except RuntimeError:  # a dict changed while read: read again
            time.sleep(0.01)
    return {}


@pytest.mark.slow
def test_random_external_kills_through_a_whole_run_lose_nothing_and_each_is_recovered(tmp_path):
    """Chaos: SIGKILLs from outside the engine (this test, by pid) of random role processes at random points of
    the run's steps, the Actor included, through a whole run. Seeded (RELAX_CHAOS_SEED overrides): a failure names its seed and
    repeats its choices. Every sample is trained exactly once and every kill has exactly one recovery event
    (its process's pid), recovered in place or by a global restart."""
    import os
    import random
    import signal
    import threading

    import psutil

    from relax.config import load_config as load
    from relax.controller import Controller
    from relax.preflight import preflight
    from relax.run_folder import RunFolder

    seed = int(os.environ.get("RELAX_CHAOS_SEED", "20261201"))
    rng = random.Random(seed)
    steps, max_kills = 10, 4
    cfg = load(ROOT / "experiments/async/cpu.yaml", [*TINY, f"steps={steps}", f"max_global_restart={max_kills}"])
    preflight(cfg, None)
    run_dir = RunFolder.create(tmp_path, cfg.name, cfg.profile, None).path
    ctl = Controller(cfg, run_dir, progress=False)
    result: dict = {}

    def run():
        try:
            result["summary"] = ctl.run()
        except BaseException as err:  # reported by the test below
            result["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    kills = []  # (pid, role, time)
    stepped = 0  # steps recorded when the last kill landed
    # Kills follow the run's progress, not the clock (a fast machine finished a clock-paced run after one kill):
    # each waits for a step after the previous kill and no restart under way, then a seeded delay into the next.
    while t.is_alive() and len(kills) < max_kills:
        time.sleep(0.05)
        sup = getattr(ctl, "supervisor", None)
        # Kill only while at least 3 steps remain: every role still has work, so each death is seen and recovered.
        if sup is None or not sup.pids or len(ctl.records) > steps - 3:
            continue
        if len(ctl.records) <= stepped or sup.restarting:
            continue
        time.sleep(rng.uniform(0.0, 0.5))
        live = _live_role_pids(sup)
        if not live:
            continue
        pid = rng.choice(sorted(live))
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                continue
            os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
        kills.append((pid, live[pid], time.time()))
        stepped = len(ctl.records)
    t.join(timeout=1800)
    assert not t.is_alive(), f"seed {seed}: the run did not end"
    assert "error" not in result, f"seed {seed}, kills {kills}: {result.get('error')!r}"
    summary = result["summary"]
    assert len(kills) >= 3, f"seed {seed}: only {len(kills)} kills landed"
    assert summary["samples_trained"] == steps * 16, (seed, kills, summary)
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0, (seed, kills, summary)
    rec = json.loads((run_dir / "recovery.json").read_text())
    events = [e for e in rec["events"] if "tier" in e]
    t0 = ctl.supervisor.t_start
    for pid, role, t_kill in kills:
        mine = [e for e in events if e["pid"] == pid]
        # A kill that hit a process a global restart (begun before it) was stopping is recovered by that restart.
        stopping = [e for e in events if e["tier"] == 2 and pid in e.get("stopped_pids", ()) and e["t_detect"] < t_kill - t0]
        assert len(mine) == 1 or (not mine and stopping), (seed, pid, role, kills, events)
        for e in mine:
            assert e["role"] == role and (e.get("superseded_by_global_restart") or e["ready_s"] > 0), (seed, e)
    assert {e["pid"] for e in events} <= {pid for pid, _, _ in kills}, (seed, kills, events)  # no death unaccounted
