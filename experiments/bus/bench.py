"""Benchmark: the bus (relax/bus over TransferQueue) under load, beside a raw memcpy and Ray's object store.

    relax bench bus                                   # small and large rows, 64 and 256 clients
    relax bench bus --kinds small --clients 64 --rows-per-put 1 16

Rows: `small` (sample_id, group_id, reward and a 64-token prompt: ~300 B) and `large` (a 20,480-token response:
int32 token ids, float32 log-probs and uint8 routed experts [T, 2]: 200 KB), as the Rollout writes them.
Clients: `--clients` threads spread over `--procs` Ray actor processes (as roles are), each putting its share of
`--rows` rows into one partition, `--rows-per-put` rows per `put_rows`, then fetching (`fetch`, task `bench`,
`max_rows = rows-per-put`) until every row was handed out. put rows/s = rows / (last put end - first put start),
across processes; get the same. Every fetched sample id is counted: lost and duplicated must both be 0.
Beside it, in the same run: `memcpy` (the same bytes copied into a reused buffer, one thread) and `ray_put`
(the same clients each `ray.put` their rows, one object per row).
Writes JSON to `--out` (default results/bus_bench/<time>.json).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter

import torch

from experiments.bench_output import write_bench
from relax.run_folder import HostLoad

TOKENS = 20_480  # a long-reasoning response
PROMPT = 64


def make_rows(kind: str, ids: list[int]) -> dict:
    n = len(ids)
    sid = torch.tensor(ids, dtype=torch.int64)
    rows = {"sample_id": sid, "group_id": sid.clone(), "reward": torch.rand(n)}
    if kind == "small":
        rows["prompt"] = torch.randint(0, 1000, (n, PROMPT), dtype=torch.int32)
    else:
        rows["response"] = [torch.randint(0, 150_000, (TOKENS,), dtype=torch.int32) for _ in range(n)]
        rows["log_probs"] = [-torch.rand(TOKENS) for _ in range(n)]
        rows["routed_experts"] = [torch.randint(0, 128, (TOKENS, 2), dtype=torch.uint8) for _ in range(n)]
    return rows


def row_bytes(rows: dict) -> int:
    total = 0
    for v in rows.values():
        for t in (v if isinstance(v, list) else [v]):
            total += t.numel() * t.element_size()
    return total


def _client_cls():
    import ray

    @ray.remote(num_cpus=0, max_concurrency=1024)
    class Client:
        """One role-like process; each concurrent call is one client thread."""

        def __init__(self, bus):
            torch.set_num_threads(1)
            self.bus = bus

        def put(self, kind: str, ids: list[int], per_put: int) -> tuple[float, float]:
            chunks = [make_rows(kind, ids[i:i + per_put]) for i in range(0, len(ids), per_put)]  # built before timing
            t0 = time.time()
            for rows in chunks:
                self.bus.put_rows(0, rows)
            return t0, time.time()

        def get(self, fields: list[str], per_put: int, total: int, counter) -> tuple[float, float, list[int]]:
            import ray as _ray

            seen = []
            t0 = time.time()
            while True:
                batch = self.bus.fetch(0, "bench", fields, per_put)
                if batch is None:
                    if _ray.get(counter.done.remote(total)):
                        break
                    time.sleep(0.001)
                    continue
                seen += batch["sample_id"].tolist()
                counter.add.remote(batch.size)
            return t0, time.time(), seen

        def ray_put(self, kind: str, ids: list[int]) -> tuple[float, float]:
            import ray as _ray

            rows = [make_rows(kind, [i]) for i in ids]
            t0 = time.time()
            refs = [_ray.put(r) for r in rows]
            t1 = time.time()
            del refs
            return t0, t1

    @ray.remote(num_cpus=0)
    class Counter_:
        def __init__(self):
            self.n = 0

        def add(self, k: int) -> None:
            self.n += k

        def done(self, total: int) -> bool:
            return self.n >= total

    return Client, Counter_


def memcpy_gbps(kind: str, n: int, repeat: int = 50) -> float:
    rows = make_rows(kind, list(range(n)))
    src = torch.cat([t.reshape(-1).view(torch.uint8) for v in rows.values() for t in (v if isinstance(v, list) else [v])])
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeat))  # the best: the least disturbed by load
    return src.numel() / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _span(results) -> float:
    return max(r[1] for r in results) - min(r[0] for r in results)


def bench_one(bus, clients, kind: str, rows: int, n_clients: int, per_put: int) -> dict:
    import ray

    _, counter_cls = _client_cls()
    bus.reset()
    shares = [list(range(c, rows, n_clients)) for c in range(n_clients)]
    shares = [s for s in shares if s]
    puts = ray.get([clients[c % len(clients)].put.remote(kind, s, per_put) for c, s in enumerate(shares)])
    counter = counter_cls.remote()
    fields = ["sample_id", "reward", "prompt"] if kind == "small" else ["sample_id", "response", "log_probs",
                                                                         "routed_experts"]
    gets = ray.get([clients[c % len(clients)].get.remote(fields, per_put, rows, counter) for c in range(len(shares))])
    ray.kill(counter)
    seen = Counter(i for g in gets for i in g[2])
    rp = ray.get([clients[c % len(clients)].ray_put.remote(kind, s) for c, s in enumerate(shares)])
    nbytes = row_bytes(make_rows(kind, [0])) * rows
    put_s, get_s, rp_s = _span(puts), _span(gets), _span(rp)
    bus.clear(0)
    return {"kind": kind, "rows": rows, "clients": len(shares), "rows_per_put": per_put, "bytes": nbytes,
            "put_rows_per_s": rows / put_s, "put_mb_per_s": nbytes / put_s / 1e6,
            "get_rows_per_s": rows / get_s, "get_mb_per_s": nbytes / get_s / 1e6,
            "ray_put_rows_per_s": rows / rp_s, "ray_put_mb_per_s": nbytes / rp_s / 1e6,
            "lost": sum(1 for i in range(rows) if seen[i] == 0), "duplicated": sum(c - 1 for c in seen.values() if c > 1),
            "unknown": sum(1 for i in seen if not 0 <= i < rows)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--kinds", nargs="+", choices=["small", "large"], default=["small", "large"])
    ap.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--rows-per-put", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--rows", type=int, default=None, help="rows per measurement (default: small 8192, large 1024)")
    ap.add_argument("--procs", type=int, default=2, help="client processes the threads are spread over")
    ap.add_argument("--storage-units", type=int, default=1)
    ap.add_argument("--out", default=None)


def main(args: argparse.Namespace) -> int:
    from relax.bus import Bus
    from relax.cluster import RaySession
    from relax.config import BusConfig

    host = HostLoad().__enter__()
    result = {"cpus": os.cpu_count(), "procs": args.procs, "storage_units": args.storage_units,
              "load_avg_1m_before": host.record["loadavg_before"][0], "torch": torch.__version__, "runs": []}
    rows_for = {k: args.rows or (8192 if k == "small" else 1024) for k in args.kinds}
    result["memcpy_gb_per_s"] = {k: memcpy_gbps(k, min(rows_for[k], 1024)) for k in args.kinds}
    with RaySession(num_cpus=max(4, os.cpu_count() or 2)):
        bus = Bus.start(BusConfig(capacity_rows=max(rows_for.values()), storage_units=args.storage_units),
                        group_size=1, max_staleness=0)
        client_cls, _ = _client_cls()
        clients = [client_cls.remote(bus) for _ in range(args.procs)]
        try:
            for kind in args.kinds:
                for n in args.clients:
                    for per in args.rows_per_put:
                        r = bench_one(bus, clients, kind, rows_for[kind], n, per)
                        r["put_vs_memcpy"] = r["put_mb_per_s"] / 1e3 / result["memcpy_gb_per_s"][kind]
                        r["get_vs_memcpy"] = r["get_mb_per_s"] / 1e3 / result["memcpy_gb_per_s"][kind]
                        result["runs"].append(r)
                        print(f"{kind:>5} rows x{r['rows']}, {r['clients']} clients, {per}/put: "
                              f"put {r['put_rows_per_s']:,.0f} rows/s {r['put_mb_per_s']:,.1f} MB/s "
                              f"({100 * r['put_vs_memcpy']:.2f}% of memcpy), get {r['get_rows_per_s']:,.0f} rows/s "
                              f"{r['get_mb_per_s']:,.1f} MB/s; ray.put {r['ray_put_rows_per_s']:,.0f} rows/s "
                              f"{r['ray_put_mb_per_s']:,.1f} MB/s; lost {r['lost']} dup {r['duplicated']}", flush=True)
        finally:
            bus.close()
    print("memcpy " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in result["memcpy_gb_per_s"].items()))
    host.__exit__(None, None, None)
    result["load_avg_1m_after"] = host.record["loadavg_after"][0]
    out = write_bench(result, "bus", args.out)
    print(f"load average {result['load_avg_1m_before']} -> {result['load_avg_1m_after']}; wrote {out}")
    return 0 if all(r["lost"] == r["duplicated"] == r["unknown"] == 0 for r in result["runs"]) else 1
