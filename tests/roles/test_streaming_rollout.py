"""Request-level streaming rollout (rollout.max_inflight): each group reaches the bus when its own last sample
ends, downstream roles start on it before the partition's slowest group is done, and every sample is trained
exactly once (one replica, and replicas sharing partitions through the GroupQueue)."""

import json
import time
from pathlib import Path

import pytest

from relax.config import ConfigError, load_config
from relax.controller import run_experiment

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "warmup.steps=40", "task.eval_size=8",
         "model.hidden_size=64", "model.intermediate_size=128", "rollout.max_inflight=4"]


def test_streaming_refuses_what_it_does_not_support():
    with pytest.raises(ConfigError, match="rollout.max_inflight.*moe.r3"):
        load_config(ROOT / "experiments/async/cpu.yaml", [*SMALL, "model.kind=tiny_qwen3_moe", "moe.r3=true"])


def _run(tmp_path, *overrides):
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [*SMALL, *overrides])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    assert summary["samples_trained"] == cfg.steps * cfg.rows_per_step
    trace = json.loads((run_dir / "trace.json").read_text())
    lanes = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    return [dict(e, role=lanes[e["tid"]]) for e in trace["traceEvents"] if e["ph"] == "X"]


@pytest.mark.slow
def test_groups_stream_to_the_bus_as_they_end(tmp_path):
    """A run: every group's rows reach the bus once, in a put of its own, each recorded from its last sample's end
    to its landing. The order itself is pinned without timing below."""
    spans = _run(tmp_path)
    for k in (0, 1):
        done = [s for s in spans if s["name"] == "group_done" and s["args"]["step"] == k]
        assert sorted(s["args"]["group"] for s in done) == [0, 1, 2, 3]


def test_a_group_is_on_the_bus_before_the_slowest_group_of_its_claim_ends(monkeypatch):
    """ClaimFeed (relax/roles/stream.py) with the engine played by hand: once group 0's last sample ends its rows are
    put, while group 1 still decodes; the claim is finished with the GroupQueue only after its last group's put."""
    import types

    import relax.roles.stream as stream

    log = []
    claims = iter([{"cid": 7, "step": 0, "groups": [0, 1], "maybe_put": False}, {"stop": True}])
    remote = lambda fn: types.SimpleNamespace(remote=fn)  # noqa: E731
    monkeypatch.setattr(stream, "ray", types.SimpleNamespace(get=lambda x: x))
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", SMALL)
    role = types.SimpleNamespace(
        cfg=cfg, replica=0, version=0, emu=None, weights=types.SimpleNamespace(staged_version=lambda: 0),
        queue=types.SimpleNamespace(claim=remote(lambda replica, upto, most: next(claims)),
                                    finish=remote(lambda cid, n: log.append(("finish", cid, n)))),
        bus=types.SimpleNamespace(oldest_unconsumed=lambda: 0),
        tokenizer=types.SimpleNamespace(encode=lambda text: [1, 2]), data=[types.SimpleNamespace(prompt="1+1=")] * 64,
        prompt_index=lambda k, g, attempt: g, groups_to_generate=lambda c: c["groups"],
        redraw=lambda k, g, attempt, gens: None, rec=types.SimpleNamespace(record=lambda *a, **kw: None),
        group_rows=lambda k, g, prompt, gens, attempt: [g],
        put_claim=lambda c, rows: log.append(("put", c["step"], [c["cid"]], rows)))
    feed = stream.ClaimFeed(role, 0)
    feed.begin()
    assert len(feed.feed(8)) == 8  # both groups' 4 samples in flight
    for number in (0, 1, 2, 3, 4):  # group 0 ends; group 1 has one sample done, three still decoding
        feed.finished(number, f"gen{number}")
    feed.putter.drain()
    assert log == [("put", 0, [7], [0])]
    for number in (5, 6, 7):
        feed.finished(number, f"gen{number}")
    feed.putter.close()
    assert log == [("put", 0, [7], [0]), ("put", 0, [7], [1]), ("finish", 7, 2)]


@pytest.mark.slow
def test_streaming_replicas_with_partial_rollout_share_partitions_exactly_once(tmp_path):
    """Two replicas claim groups of the same partitions through the GroupQueue, with partial rollout (in-flight
    requests load each new version): every group is put once (`_run` audits the samples), and staleness counts from
    a row's first token's version, so the gate's s = 1 holds on it; the span is recorded beside it (the emulated
    test in tests/emulate/ has responses long enough for a version to arrive mid-request)."""
    spans = _run(tmp_path, "rollout.replicas=2", "rollout.chunk_groups=2", "rollout.partial=true", "steps=3",
                 "max_staleness=1", *DAPO)
    assert len([s for s in spans if s["name"] == "group_done"]) == 12  # a redrawn group is put once, its last draw
    rows = [json.loads(line) for line in next(tmp_path.rglob("metrics.jsonl")).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["staleness_max"] <= 1 and 0.0 <= r["partial_rows_share"] <= 1.0 and r["partial_span_max"] >= 0
    _assert_redrawn(rows)


# DAPO redraws under streaming: the tiny model mostly answers wrong, so nearly every group's rewards are all equal
# and its slot is drawn again (a fresh prompt) before it goes to the bus, up to 3 draws.
DAPO = ["algorithm.dynamic_sampling.enabled=true", "algorithm.dynamic_sampling.max_batches=3"]


def _assert_redrawn(rows):
    assert sum(r["groups_resampled"] for r in rows) > 0
    assert all(r["groups_generated"] > 4 if r["groups_resampled"] else r["groups_generated"] == 4 for r in rows)
    assert all(r["groups_generated"] <= 3 * 4 for r in rows)


@pytest.mark.slow
def test_colocated_streaming_redraws_degenerate_groups(tmp_path):
    """relax's colocate loop streams its share of each partition (RolloutRole._stream_groups): a degenerate group
    is drawn again before it is put, and every sample is trained once (`_run` audits)."""
    _run(tmp_path, "mode=colocate", "max_staleness=0", *DAPO)
    _assert_redrawn([json.loads(line) for line in next(tmp_path.rglob("metrics.jsonl")).read_text().splitlines()])


def test_a_new_stream_claims_at_once_whatever_ended_the_last(monkeypatch):
    """ClaimFeed (relax/roles/stream.py): a stream that ran dry because partition k + 1 was not yet open says `next`;
    the replica's loop enters k + 1 and begins a new stream, which must claim at once. Were `next` left standing
    (and the feed quiet for QUIET_S), a gate that opened at once would end the new stream empty and send the loop
    on to k + 2, skipping k + 1."""
    import types

    import relax.roles.stream as stream

    asked, answers = [], iter([{"next": True}, {"cid": 0, "step": 1, "groups": [0], "maybe_put": False}])

    def claim(replica, upto, most):
        asked.append(upto)
        return next(answers)

    monkeypatch.setattr(stream, "ray", types.SimpleNamespace(get=lambda x: x))
    monkeypatch.setattr(stream, "can_start", lambda k, oldest, s: False)  # partition 1 not open yet
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", SMALL)
    role = types.SimpleNamespace(
        cfg=cfg, replica=0, version=0, emu=None, queue=types.SimpleNamespace(claim=types.SimpleNamespace(remote=claim)),
        weights=types.SimpleNamespace(staged_version=lambda: 0), bus=types.SimpleNamespace(oldest_unconsumed=lambda: 0),
        tokenizer=types.SimpleNamespace(encode=lambda text: [1, 2]), data=[types.SimpleNamespace(prompt="1+1=")] * 64,
        prompt_index=lambda k, g, attempt: 0, groups_to_generate=lambda c: c["groups"])
    feed = stream.ClaimFeed(role, 0)
    feed.begin()
    assert feed.feed(4) == [] and feed.next and asked == [0]
    feed.k += 1  # what RolloutRole._run_streaming does on `next`: enter partition 1 (its gate), then a new stream
    feed.begin()
    assert not feed.next and len(feed.feed(4)) == 4 and asked == [0, 1]  # claimed partition 1 at once


def test_partial_rollout_needs_streaming_and_async():
    with pytest.raises(ConfigError, match="rollout.partial"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["rollout.partial=true"])
    with pytest.raises(ConfigError, match="rollout.partial"):
        load_config(ROOT / "experiments/async/cpu.yaml", [*SMALL, "rollout.partial=true", "mode=colocate",
                                                          "max_staleness=0"])


@pytest.mark.slow
def test_a_replica_refills_its_engine_across_claims_and_partitions(tmp_path):
    """One claim is one group (chunk_groups=1, as many requests as max_inflight): the replica claims the next
    group as soon as a slot frees, so claims overlap, and it enters partition 1 (s = 1: the gate and version 0
    admit it) while partition 0's last group still decodes, instead of draining its engine at every claim's tail.
    (Partition 2 needs version 1, which a replica without partial rollout loads only once its engine drained.)"""
    spans = _run(tmp_path, "rollout.chunk_groups=1", "steps=3", "max_staleness=1")
    claims = sorted((s for s in spans if s["name"] == "generate"), key=lambda s: s["ts"])
    assert len(claims) == 3 * 4 and all(s["args"]["groups"] == 1 for s in claims)
    assert any(b["ts"] < a["ts"] + a["dur"] for a, b in zip(claims, claims[1:]))  # the next claim joined mid-claim
    last_0 = max(s["ts"] + s["dur"] for s in spans if s["name"] == "group_done" and s["args"]["step"] == 0)
    assert min(s["ts"] for s in claims if s["args"]["step"] == 1) < last_0


def test_the_putter_puts_in_order_off_the_decode_loop_and_raises_a_failed_put_in_the_loop():
    """Putter (relax/roles/stream.py): groups submitted while a put travels wait for it and go out one a put, in
    order; a failed put is raised in the replica's loop (the next submit or drain)."""
    import threading

    from relax.roles.stream import Putter

    calls, release = [], threading.Event()

    def put(k, item):
        calls.append((k, item))
        if item == "boom":
            raise RuntimeError("bus down")
        release.wait(10)

    putter = Putter(put)
    putter.submit(0, "a")  # taken at once; its put blocks until released
    deadline = time.time() + 10
    while not calls and time.time() < deadline:
        time.sleep(0.001)
    for k, item in [(0, "b"), (0, "c"), (1, "d")]:
        putter.submit(k, item)  # returns at once: the caller (the decode loop) never waits for a put
    assert calls == [(0, "a")]
    release.set()
    putter.drain()
    assert calls == [(0, "a"), (0, "b"), (0, "c"), (1, "d")]
    putter.submit(2, "boom")
    with pytest.raises(RuntimeError, match="bus down"):
        putter.drain()
    putter.close()


def test_the_colocate_share_streams_each_sample_at_its_own_limit_and_redraws_ahead_of_the_rest():
    """RolloutRole._stream_groups (the colocate loop's share), the engine played by a fake that finishes requests in
    the order it got them: each request carries its own sample's limit (emulated: the modelled length of that
    group's sample), a degenerate group's redraw goes to the engine before the groups still waiting, and each group
    is put once, from its last draw."""
    import types

    from relax.roles.rollout import RolloutRole

    G, given, puts = 2, [], []

    class Engine:
        def generate_stream(self, feed, max_inflight):
            number = 0
            while batch := feed(1):  # one slot: the order the feed hands requests out is the order they run
                given.extend(batch)
                yield number, f"gen{number}"
                number += 1

    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [*SMALL, "rollout.group_size=2"])
    fake = types.SimpleNamespace(
        cfg=cfg, engine=Engine(), tokenizer=types.SimpleNamespace(encode=lambda text: [len(text)]),
        data=[types.SimpleNamespace(prompt="x" * (i + 1)) for i in range(64)],
        prompt_index=lambda k, g, attempt: 10 * attempt + g,  # prompt ids [10 * attempt + g + 1]
        emu=types.SimpleNamespace(limits=lambda k, gs: [100 * g + j for g in gs for j in range(G)]),
        redraw=lambda k, g, attempt, gens: [10 * (attempt + 1) + g + 1] if (g, attempt) == (0, 0) else None,
        group_rows=lambda k, g, prompt, gens, attempt: (g, prompt, gens, attempt),
        rec=types.SimpleNamespace(record=lambda *a, **kw: None))
    RolloutRole.__ray_actor_class__._stream_groups(fake, 0, [0, 1], puts.append)
    assert given == [([1], 0), ([1], 1), ([11], 0), ([11], 1), ([2], 100), ([2], 101)]
    assert puts == [(0, [11], ["gen2", "gen3"], 1), (1, [2], ["gen4", "gen5"], 0)]
