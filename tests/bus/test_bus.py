"""The data bus (relax.bus) against a real Ray + TransferQueue session, shared by the whole module."""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import Counter

import pytest
import ray
import torch

from relax.bus import Batch, Bus, StreamingLoader
from relax.bus.gate import PartitionTrained
from relax.bus.sampler import PUT_KEY, ROW_KEY, GroupSampler
from relax.config import BusConfig

# Ray workers cannot import this module by name (pytest put tests/ on the driver's path only): ship its
# actors and helpers by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

G = 4  # group size
CAPACITY = 256


def make_rows(groups: list[int], seed: int = 0) -> dict:
    """Rows of `groups` (G consecutive rows each), with every supported kind of field value."""
    gen = torch.Generator().manual_seed(seed)
    n = len(groups) * G
    lens = torch.randint(0, 12, (n,), generator=gen)  # 0: an empty response must survive too
    sample_ids = [g * G + j for g in groups for j in range(G)]
    return {
        "sample_id": torch.tensor(sample_ids),
        "group_id": [g for g in groups for _ in range(G)],  # a list of int is accepted too
        "response_ids": [torch.randint(0, 50_000, (int(t),), generator=gen) for t in lens],
        "log_probs": [torch.randn(int(t), generator=gen) for t in lens],
        "experts": [torch.randint(0, 8, (int(t), 2), generator=gen, dtype=torch.int8) for t in lens],
        "total_len": lens + 3,
        "reward": torch.rand(n, generator=gen),
        "prompt": [f"prompt {s} · é" if s % 3 else "" for s in sample_ids],
    }


def by_sample(batch: Batch) -> dict[int, dict]:
    return {
        int(s): {k: v[i] for k, v in batch.data.items()} for i, s in enumerate(batch["sample_id"].tolist())
    }


def assert_whole_groups(batch: Batch) -> None:
    gids = batch["group_id"].tolist()
    assert len(gids) % G == 0
    for lo in range(0, len(gids), G):
        assert gids[lo : lo + G] == [gids[lo]] * G, f"split group in {gids}"
    assert len(set(gids)) == len(gids) // G


@pytest.fixture(scope="module")
def bus():
    from relax.cluster import RaySession

    with RaySession(num_cpus=8):
        # TQ starts on a thread (as a run's driver starts it): the module's first TQ call waits for it by itself.
        b = Bus.start(BusConfig(capacity_rows=CAPACITY), group_size=G, max_staleness=1, wait=False)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def fresh(bus: Bus) -> Bus:
    bus.reset(max_staleness=1)
    return bus


@ray.remote(num_cpus=0.5, max_concurrency=2)
class Worker:
    """A role-like process using the bus it was handed (pickled) or found (Bus.connect)."""

    def __init__(self, bus: Bus | None):
        torch.set_num_threads(1)
        self.bus = bus if bus is not None else Bus.connect()

    def produce(self, steps: int, groups_per_step: int, chunk_groups: int, delay_s: float, seed: int) -> list[int]:
        """Rollout: gate, then put chunks; returns k - oldest_unconsumed observed just before every put."""
        rng = random.Random(seed)
        lags = []
        for k in range(steps):
            self.bus.wait_can_start(k, timeout=30)
            for lo in range(0, groups_per_step, chunk_groups):
                time.sleep(rng.uniform(0, delay_s))
                groups = [k * groups_per_step + g for g in range(lo, lo + chunk_groups)]
                lags.append(k - self.bus.oldest_unconsumed())  # oldest only grows: an upper bound at put time
                self.bus.put_rows(k, make_rows(groups, seed=k * 1000 + lo))
        return lags

    def train(self, steps: int, rows: int, delay_s: float, seed: int) -> list[int]:
        """Trainer: stream each partition, then mark it trained and clear it; returns sample ids seen."""
        rng = random.Random(seed)
        seen = []
        for k in range(steps):
            loader = StreamingLoader(self.bus, k, "actor_train", ["sample_id"], rows, G, 60, timeout_s=30)
            for mb in loader:
                time.sleep(rng.uniform(0, delay_s))
                seen += mb["sample_id"].tolist()
            self.bus.mark_trained(k)
            self.bus.clear(k)
        return seen

    def consume(self, steps, task, fields, expect_rows, whole_groups, out_field, counter) -> list[int]:
        """A service role: fetch what is ready (other workers may share the task), optionally write a field."""
        seen = []
        deadline = time.time() + 30
        while ray.get(counter.total.remote(task)) < expect_rows:
            assert time.time() < deadline, f"{task}: timed out after {len(seen)} rows"
            got = False
            for k in steps:
                batch = self.bus.fetch(k, task, fields, max_rows=8, whole_groups=whole_groups)
                if batch is None:
                    continue
                got = True
                if whole_groups:
                    assert_whole_groups(batch)
                if out_field:
                    self.bus.write(batch, {out_field: batch["reward"] * 2})
                seen += batch["sample_id"].tolist()
                ray.get(counter.add.remote(task, batch.size))
            if not got:
                time.sleep(0.005)
        return seen


@ray.remote(num_cpus=0)
class RowCounter:
    """Rows consumed per task, summed over the workers sharing it (tells them when to stop)."""

    def __init__(self):
        self.n = Counter()

    def add(self, task: str, rows: int) -> None:
        self.n[task] += rows

    def total(self, task: str) -> int:
        return self.n[task]


@pytest.fixture(scope="module")
def workers(bus: Bus) -> list:
    # The third finds the bus by name instead of receiving it.
    ws = [Worker.remote(bus), Worker.remote(bus), Worker.remote(None)]
    ray.get([w.__ray_ready__.remote() for w in ws])
    return ws


# ---- 3. the sampler alone: whole, aligned groups only ------------------------------------------------------


class FakePartition:
    def __init__(self, meta: dict[int, dict]):
        self.meta = meta

    def get_custom_meta(self, indexes):
        return {i: self.meta[i] for i in indexes if i in self.meta}


def test_sampler_never_returns_a_window_straddling_two_groups():
    # Two groups of 3, put as one put; TQ's GRPOGroupNSampler would return [1, 2, 3] here.
    part = FakePartition({i: {PUT_KEY: 0, ROW_KEY: i} for i in range(6)})
    s = GroupSampler()
    assert s.sample([1, 2, 3], 1, partition=part, max_rows=3, group_size=3, whole_groups=True) == ([], [])
    assert s.sample([1, 2, 3, 4, 5], 1, partition=part, max_rows=6, group_size=3, whole_groups=True)[0] == [3, 4, 5]
    # Reused global indexes: a group need not be consecutive, nor in index order; insertion order wins.
    part = FakePartition({9: {PUT_KEY: 1, ROW_KEY: 0}, 2: {PUT_KEY: 1, ROW_KEY: 1}, 5: {PUT_KEY: 0, ROW_KEY: 0}})
    assert s.sample([2, 5, 9], 1, partition=part, max_rows=2, group_size=2, whole_groups=True)[0] == [9, 2]
    assert s.sample([2, 5, 9], 1, partition=part, max_rows=2)[0] == [5, 9]
    # Rows whose custom metadata has not landed yet are not handed out.
    assert s.sample([2, 7], 1, partition=part, max_rows=4)[0] == [2]


# ---- 4. round trip of every field kind -------------------------------------------------------------------


def test_round_trip_every_field_kind(fresh: Bus):
    rows = make_rows([0, 1, 2], seed=1)
    fields = list(rows)
    indexes = fresh.put_rows(0, rows)
    assert len(indexes) == 3 * G
    batch = fresh.fetch(0, "check", fields, max_rows=100)
    assert batch.size == 3 * G and batch.indexes == indexes  # insertion order
    assert fresh.fetch(0, "check", fields, max_rows=100) is None  # consumed by this task
    assert torch.equal(batch["sample_id"], rows["sample_id"]) and batch["group_id"].tolist() == rows["group_id"]
    for name in ("response_ids", "log_probs", "experts"):
        got = batch[name]
        assert isinstance(got, list) and all(not t.is_nested for t in got)
        for a, b in zip(got, rows[name]):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    for name in ("total_len", "reward"):
        assert batch[name].dtype == rows[name].dtype and torch.equal(batch[name], rows[name])
    assert batch["prompt"] == rows["prompt"]

    # A role writes new fields of every kind on rows it fetched (a subset, in its own order).
    part = batch.select([5, 0, 7])
    new = {
        "ref_log_probs": [torch.randn(len(t)) for t in part["response_ids"]],
        "advantage": torch.tensor([0.5, -1.0, 2.0]),
        "verdict": ["ok", "bad", "ok"],
        "routed": [torch.zeros(2, 3), torch.ones(0, 3), torch.ones(1, 3)],
        "tag": ["same"] * 3,  # identical strings must not collapse into one value
    }
    new["routed"] = [t.to(torch.int8) for t in new["routed"]]
    fresh.write(part, new)
    back = fresh.fetch(0, "downstream", ["sample_id", *new], max_rows=100)
    assert back.size == 3 and back.indexes == sorted(part.indexes, key=indexes.index)
    want = {s: i for i, s in enumerate(part["sample_id"].tolist())}
    for i, s in enumerate(back["sample_id"].tolist()):
        j = want[s]
        assert torch.equal(back["ref_log_probs"][i], new["ref_log_probs"][j])
        assert back["advantage"][i] == new["advantage"][j] and back["verdict"][i] == new["verdict"][j]
        assert back["tag"][i] == "same"
        assert torch.equal(back["routed"][i], new["routed"][j]) and back["routed"][i].dtype == torch.int8


# ---- 6. bad input ----------------------------------------------------------------------------------------


def test_bad_input_gets_a_clear_error_and_writes_nothing(fresh: Bus):
    rows = make_rows([0, 1])
    partial = {k: v[: G + 1] for k, v in rows.items()}
    with pytest.raises(ValueError, match="not a whole number of groups of group_size=4"):
        fresh.put_rows(0, partial)
    with pytest.raises(ValueError, match="must include the int field 'sample_id'"):
        fresh.put_rows(0, {k: v for k, v in rows.items() if k != "sample_id"})
    with pytest.raises(ValueError, match=r"mismatched lengths.*'reward': 7"):
        fresh.put_rows(0, {**rows, "reward": rows["reward"][:7]})
    with pytest.raises(ValueError, match="'group_id' must be constant"):
        fresh.put_rows(0, {**rows, "group_id": list(range(2 * G))})
    with pytest.raises(ValueError, match="'sample_id' values must be unique"):
        fresh.put_rows(0, {**rows, "sample_id": torch.zeros(2 * G, dtype=torch.long)})
    with pytest.raises(ValueError, match="field 'sample_id' must be one int per row"):
        fresh.put_rows(0, {**rows, "sample_id": torch.rand(2 * G)})
    with pytest.raises(ValueError, match="field 'log_probs': per-row tensors must share dtype"):
        fresh.put_rows(0, {**rows, "log_probs": [torch.zeros(2), *rows["response_ids"][1:]]})
    with pytest.raises(TypeError, match="field 'prompt': mixes strings"):
        fresh.put_rows(0, {**rows, "prompt": ["a", 1] * G})
    with pytest.raises(ValueError, match="can never fit in bus.capacity_rows"):
        fresh.put_rows(0, make_rows(list(range(CAPACITY // G + 1))))
    assert fresh.held_rows() == {} and fresh.fetch(0, "t", ["sample_id"], max_rows=100) is None

    fresh.put_rows(0, rows)
    batch = fresh.fetch(0, "t", ["reward"], max_rows=100)
    with pytest.raises(ValueError, match="write: 3 values per field for a batch of 8 rows"):
        fresh.write(batch, {"x": torch.zeros(3)})
    with pytest.raises(ValueError, match="max_rows=3 cannot hold a row group"):
        fresh.fetch(0, "t2", ["reward"], max_rows=3, whole_groups=True)
    fresh.mark_trained(0)
    with pytest.raises(PartitionTrained, match="partition 0 was already marked trained"):
        fresh.put_rows(0, make_rows([5]))
    with pytest.raises(TimeoutError, match=r"wait_can_start\(3\): still gated after 0.1 s \(oldest unconsumed 1, max_"):
        fresh.wait_can_start(3, timeout=0.1)


def test_capacity_blocks_puts_until_a_partition_is_cleared(fresh: Bus):
    for k in range(CAPACITY // (16 * G)):
        fresh.put_rows(k, make_rows(list(range(k * 16, k * 16 + 16))))
    assert sum(fresh.held_rows().values()) == CAPACITY
    with pytest.raises(TimeoutError, match="bus full for 0.2 s: 256 of bus.capacity_rows=256"):
        fresh.put_rows(9, make_rows([900]), timeout=0.2)
    threading.Timer(0.3, fresh.clear, args=(0,)).start()
    t0 = time.time()
    fresh.put_rows(9, make_rows([900]), timeout=10)
    assert time.time() - t0 >= 0.25
    assert fresh.held_rows() == {1: 64, 2: 64, 3: 64, 9: G}


def test_a_partition_a_producer_died_in_still_clears(fresh: Bus):
    """Killed between TQ's index allocation and its write, a producer leaves rows TQ never sized its status for;
    TQ's own clear then fails (IndexError in its controller). The bus marks them and clears the partition."""
    from relax.bus.bus import partition_id
    from relax.fault.redelivery import live_partitions

    rows = make_rows(list(range(8)))
    fresh.put_rows(0, rows)
    fresh._tq().get_meta(data_fields=list(rows), batch_size=8, partition_id=partition_id(0), mode="insert")
    fresh.clear(0)
    assert 0 not in live_partitions(fresh) and 0 not in fresh.held_rows()
    fresh.put_rows(1, make_rows(list(range(100, 108))))  # the bus goes on
    assert fresh.held_rows() == {1: 8 * G}


def test_puts_writes_and_redeliveries_each_wake_a_consumer_waiting_on_the_partition(fresh: Bus):
    """A consumer that found nothing waits in the coordinator on the partition's change count: every put, write and
    redelivery bumps it. A missing notice would hold the wait for its whole 60 s and return the old count."""
    from relax.fault.redelivery import redeliver

    def changed(seen):
        return ray.get(fresh._coord.wait_changed.remote(5, seen, 60.0))

    c0 = changed(None)
    fresh.put_rows(5, make_rows([50, 51]))
    c1 = changed(c0)
    batch = fresh.fetch(5, "reward", ["response_ids"], 2 * G)
    fresh.write(batch, {"score": torch.ones(batch.size)})
    c2 = changed(c1)
    redeliver(fresh, "reward")
    assert (c1, c2, changed(c2)) == (c0 + 1, c0 + 2, c0 + 3)


def test_a_consumer_waits_only_on_the_fields_it_needs(fresh: Bus):
    """A write of another field does not wake a consumer (each spurious wake was a fetch through TransferQueue);
    a write of one of its fields, a put carrying one, and a redelivery do."""
    from relax.fault.redelivery import redeliver

    def changed(seen, fields, timeout=60.0):
        return ray.get(fresh._coord.wait_changed.remote(4, seen, timeout, fields))

    needs = ["score"]  # e.g. Advantages, waiting on Reward
    c0 = changed(None, needs)
    fresh.put_rows(4, make_rows([40, 41]))  # response_ids, ...: not its field
    batch = fresh.fetch(4, "reference", ["response_ids"], 2 * G)
    fresh.write(batch, {"ref_log_probs": [torch.zeros(3)] * batch.size})
    t0 = time.monotonic()
    assert changed(c0, needs, timeout=1.0) == c0  # neither woke it: it waited its whole timeout
    assert time.monotonic() - t0 >= 0.9
    batch = fresh.fetch(4, "reward", ["response_ids"], 2 * G)
    fresh.write(batch, {"score": torch.ones(batch.size)})
    c1 = changed(c0, needs)
    assert c1 == c0 + 1
    assert changed(None, ["response_ids"]) >= 1  # the put counted for a consumer of its fields
    redeliver(fresh, "advantages")
    assert changed(c1, needs) == c1 + 1


def test_the_bus_counts_this_processs_operations_by_kind(fresh: Bus):
    """Bus.calls (summary.json bus_calls_per_step): a put, a fetch that found rows, a write, a lookup that found
    none (here: a field no one wrote) and a block in the coordinator are each counted under their own kind."""
    before = dict(fresh.calls)

    def delta():
        return {k: n - before.get(k, 0) for k, n in fresh.calls.items() if n != before.get(k, 0)}

    fresh.put_rows(7, make_rows([70, 71]))
    assert fresh.fetch(7, "reward", ["score"], 2 * G) is None  # no row has a score yet
    batch = fresh.fetch(7, "reward", ["response_ids"], 2 * G)
    fresh.write(batch, {"score": torch.ones(batch.size)})
    assert delta() == {"put": 1, "empty_fetch": 1, "fetch": 1, "write": 1}
    assert fresh.fetch(7, "reward", ["response_ids"], 2 * G, wait=0.3) is None  # all taken: waits, finds none
    got = delta()
    assert got["wait"] >= 1 and got["empty_fetch"] >= 3 and (got["put"], got["fetch"], got["write"]) == (1, 1, 1)


def test_an_idle_consumer_blocks_on_the_count_it_read_last_one_lookup_per_wait(fresh: Bus, monkeypatch):
    """The first time a consumer finds nothing in a partition it reads the change count, looks once more and
    blocks; after that each idle costs one empty lookup and one block in the coordinator, not two of each (the
    count it read on waking is still good to wait on). Rows land only after the empty lookup, from another thread."""
    once = fresh._fetch_once

    def lookup(*a):
        got = once(*a)
        if got is None and not timers:  # the rows land after the consumer found none
            timers.append(threading.Timer(0.2, fresh.put_rows, args=(5, make_rows([next(groups)]))))
            timers[-1].start()
        return got
    monkeypatch.setattr(fresh, "_fetch_once", lookup)
    groups = iter([51, 52])
    fresh.put_rows(5, make_rows([50]))
    assert fresh.fetch(5, "reward", ["response_ids"], 2 * G).size == G
    costs = []
    for _ in range(2):
        timers, before = [], dict(fresh.calls)
        assert fresh.fetch(5, "reward", ["response_ids"], 2 * G, wait=30.0).size == G
        timers[0].join()
        costs.append({k: fresh.calls[k] - before.get(k, 0) for k in ("empty_fetch", "wait", "fetch")})
    assert costs == [{"empty_fetch": 2, "wait": 2, "fetch": 1}, {"empty_fetch": 1, "wait": 1, "fetch": 1}]


def test_an_idle_fetch_waits_without_polling_and_wakes_when_rows_land(fresh: Bus, monkeypatch):
    calls = []
    once = fresh._fetch_once
    monkeypatch.setattr(fresh, "_fetch_once", lambda *a: calls.append(a) or once(*a))
    assert fresh.fetch(6, "reward", ["response_ids"], 2 * G, wait=0.5) is None
    assert len(calls) <= 3  # a fetch, then waits on the change count (polling every few ms would be ~100)
    threading.Timer(0.3, fresh.put_rows, args=(6, make_rows([60, 61]))).start()
    t0 = time.monotonic()
    got = fresh.fetch(6, "reward", ["response_ids"], 2 * G, wait=60.0)
    assert got is not None and got.size == 2 * G and len(calls) <= 6
    assert time.monotonic() - t0 < 30  # woken by the put, not by the end of the wait


# ---- 3. whole groups under random readiness -----------------------------------------------------------------


def test_whole_group_fetches_never_split_a_group(fresh: Bus):
    # Put and clear partitions of odd sizes first, so TQ hands out reused, scattered global indexes.
    fresh.put_rows(7, make_rows([70, 71, 72]))
    fresh.put_rows(8, make_rows([80]))
    fresh.clear(7)
    fresh.put_rows(8, make_rows([81, 82]))
    fresh.clear(8)
    for lo in range(0, 16, 2):
        fresh.put_rows(0, make_rows([lo, lo + 1]))
    scorer = fresh.fetch(0, "score", ["sample_id"], max_rows=1000)
    assert scorer.size == 16 * G
    rng = random.Random(3)
    order = list(range(scorer.size))
    rng.shuffle(order)
    taken = []
    fields = ["group_id", "sample_id", "score"]
    while order:
        n = rng.randint(1, 7)
        cut, order = order[:n], order[n:]
        fresh.write(scorer.select(cut), {"score": torch.ones(len(cut))})
        got = fresh.fetch(0, "train", fields, max_rows=rng.choice([4, 8, 11, 64]), whole_groups=True)
        if got is not None:
            assert_whole_groups(got)
            taken += got["group_id"].tolist()
    while (got := fresh.fetch(0, "train", fields, max_rows=64, whole_groups=True)) is not None:
        assert_whole_groups(got)
        taken += got["group_id"].tolist()
    assert Counter(taken) == {g: G for g in range(16)}


# ---- 5. streaming loader -----------------------------------------------------------------------------------


def test_streaming_loader_yields_whole_groups_within_budget_exactly_once(fresh: Bus):
    budget = 100
    groups = 12
    rows = make_rows(list(range(groups)), seed=5)
    rows["total_len"] = torch.randint(5, 40, (groups * G,), generator=torch.Generator().manual_seed(6))

    def produce():
        for g in range(groups):
            time.sleep(0.02)
            fresh.put_rows(0, {k: v[g * G : (g + 1) * G] for k, v in rows.items()})

    producer = threading.Thread(target=produce)
    t0 = time.time()
    producer.start()
    loader = StreamingLoader(fresh, 0, "actor_train", ["sample_id", "group_id"], groups * G, G, budget, timeout_s=10)
    seen = []
    for mb in loader:
        assert_whole_groups(mb)
        tokens = int(mb["total_len"].sum())
        assert tokens <= budget or mb.size == G
        seen += mb["sample_id"].tolist()
        time.sleep(0.01)
    elapsed = time.time() - t0
    producer.join()
    assert sorted(seen) == rows["sample_id"].tolist()
    # The producer is slower than the trainer: most of the time went into waiting, and it was counted.
    assert 0.1 < loader.wait_s < elapsed


# ---- 1. staleness bound; 2. exactly once per task across processes ---------------------------------------------


@pytest.mark.parametrize("s", [0, 1, 2])
def test_staleness_bound_holds_under_random_delays(bus: Bus, workers, s: int):
    bus.reset(max_staleness=s)
    steps, groups = 5, 4
    producer, trainer = workers[0], workers[1]
    lags_ref = producer.produce.remote(steps, groups, 2, delay_s=0.005, seed=s)
    seen = ray.get(trainer.train.remote(steps, groups * G, delay_s=0.06, seed=s), timeout=60)
    lags = ray.get(lags_ref)
    assert max(lags) <= s
    assert max(lags) == s  # the producer is faster, so it was held at the bound, not below it
    assert sorted(seen) == list(range(steps * groups * G))
    assert bus.oldest_unconsumed() == steps and bus.held_rows() == {}


def test_every_sample_consumed_exactly_once_per_task(fresh: Bus, workers):
    steps, groups = [0, 1, 2], 6
    w0, w1, w2 = workers
    total = len(steps) * groups * G
    counter = RowCounter.remote()
    # Two processes share "reward" (and write "score"); "ref" and "actor_train" (whole groups, after "score").
    calls = [
        w0.consume.remote(steps, "reward", ["sample_id", "reward"], total, False, "score", counter),
        w1.consume.remote(steps, "reward", ["sample_id", "reward"], total, False, "score", counter),
        w2.consume.remote(steps, "ref", ["sample_id", "reward"], total, False, None, counter),
    ]
    for k in steps:
        for lo in range(0, groups, 2):
            fresh.put_rows(k, make_rows([k * groups + lo, k * groups + lo + 1], seed=k + lo))
    train_fields = ["sample_id", "group_id", "score"]
    trained = ray.get(w2.consume.remote(steps, "actor_train", train_fields, total, True, None, counter), timeout=60)
    reward = ray.get(calls[0], timeout=60) + ray.get(calls[1], timeout=60)
    ref = ray.get(calls[2], timeout=60)
    everyone = Counter(range(total))
    for name, ids in (("reward", reward), ("ref", ref), ("actor_train", trained)):
        assert Counter(ids) == everyone, name


def test_concurrent_puts_of_one_process_each_land_once_in_their_own_order(fresh: Bus):
    """Puts made while the process is sending travel together (one reservation, one TQ put); each caller still
    gets its own rows' indexes, every row is stored once, and whole-group fetches keep each put's row order."""
    threads, per = 24, 2  # groups per put
    got: dict[int, list[int]] = {}
    errors = []

    def put(t):
        try:
            got[t] = fresh.put_rows(0, make_rows([t * per + g for g in range(per)], seed=t))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    ts = [threading.Thread(target=put, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors and len(got) == threads
    assert all(len(ix) == per * G for ix in got.values())
    assert len({i for ix in got.values() for i in ix}) == threads * per * G  # no index handed to two puts
    seen = []
    while (b := fresh.fetch(0, "once", ["sample_id", "group_id"], 8 * G, whole_groups=True)) is not None:
        ids = b["sample_id"].tolist()
        for lo in range(0, len(ids), G):  # a group's rows come whole and in the order they were put
            assert ids[lo:lo + G] == list(range(ids[lo], ids[lo] + G)) and ids[lo] % G == 0
        seen += ids
    assert Counter(seen) == Counter(range(threads * per * G))


def test_a_bus_whose_tq_failed_to_start_raises_it_in_wait_started_once(monkeypatch):
    import relax.bus.bus as bus_module

    def no_controller(conf=None):
        raise ValueError("no controller")

    monkeypatch.setattr(bus_module.tq, "init", no_controller)
    b = Bus(None, G, CAPACITY)
    b._start_tq(BusConfig(capacity_rows=CAPACITY), max_staleness=1)  # what Bus.start(wait=False)'s thread runs
    with pytest.raises(RuntimeError, match="TransferQueue did not start: no controller"):
        b.wait_started()
    b.wait_started()  # the error was the caller's once; a second wait has nothing to join or raise
