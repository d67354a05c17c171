"""Benchmark: DCS weight-sync bandwidth against the raw loopback bandwidth of the same collective.

    relax bench dcs --mb 256 --bucket-mb 16 64 256 --repeat 5
    relax bench dcs --mb 1.6 --bucket-mb 64 --groups reused fresh   # the tiny model

raw: two plain processes, one gloo `broadcast` of the whole payload into a warm buffer (the ceiling).
dcs: a Ray session (relax.cluster.RaySession) with the coordinator; a publisher actor publishes a synthetic
model of `--mb` MB (`--tensors` tensors) and a receiver actor pulls every version through the DCS. Reported per bucket size:
`transfer` (session accepted -> every bucket received, as the receiver saw it), `sync` (the receiver's whole
`sync` call: request, pairing, transfer, copy into its own parameters) and `publish` (the publisher's stall:
copy into the staging + announce). Effective bandwidth = payload bytes / seconds, from the best of the repeats
(the machine is shared: the best run is the closest to what the code can do; medians are in the JSON too);
the raw broadcast is measured before and after the DCS runs and its best is the reference.
`--groups reused fresh`: the DCS with one process group per pair reused across versions (the default) and
with a new group per transfer (`dcs.reuse_groups: false`), side by side; the first transfer of each setting
(which makes the reused group) is left out of both.
`disk`: the same weights saved with torch.save and loaded back into the receiver's parameters (torch.load +
copy), from the page cache (`warm`) and after evicting the file's pages with posix_fadvise (`cold`).
Writes JSON to `--out` (default results/dcs_bench/<time>.json).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from experiments.bench_output import write_bench
from relax.run_folder import HostLoad


def _raw_worker(rank: int, port: int, numel: int, repeat: int, q) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    opts._timeout = timedelta(seconds=60)
    pg = dist.ProcessGroupGloo(store, rank, 2, opts)
    buf = torch.ones(numel) if rank == 0 else torch.zeros(numel)
    bo = dist.BroadcastOptions()
    bo.rootRank = 0
    times = []
    for _ in range(repeat + 1):  # the first one warms the buffers and the connection
        pg.barrier().wait()
        t0 = time.perf_counter()
        pg.broadcast([buf], bo).wait()
        times.append(time.perf_counter() - t0)
    if rank == 1:
        q.put(times[1:])


def raw_broadcast(nbytes: int, repeat: int) -> list[float]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    procs = [ctx.Process(target=_raw_worker, args=(r, port, nbytes // 4, repeat, q)) for r in range(2)]
    for p in procs:
        p.start()
    times = q.get(timeout=600)
    for p in procs:
        p.join()
    return times


def synthetic(total_bytes: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    per = total_bytes // 4 // n
    return {f"layer.{i}.weight": torch.randn(per, generator=g) for i in range(n)}


def disk_reload(total_bytes: int, n: int, repeat: int, folder: Path) -> dict:
    """Seconds to reload the weights from a torch.save file into existing parameters (median of repeats)."""
    torch.set_num_threads(1)
    path = folder / "weights.pt"
    torch.save(synthetic(total_bytes, n, 0), path)
    params = {k: torch.zeros_like(v) for k, v in synthetic(total_bytes, n, 1).items()}
    out = {}
    for mode in ("warm", "cold"):
        times = []
        for _ in range(repeat):
            if mode == "cold":
                fd = os.open(path, os.O_RDONLY)
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            t0 = time.perf_counter()
            state = torch.load(path, weights_only=True)
            for k, p in params.items():
                p.copy_(state[k])
            times.append(time.perf_counter() - t0)
            del state
        out[mode] = {"median_s": statistics.median(times), "all_s": times}
    out["bytes"] = path.stat().st_size
    path.unlink()
    return out


def dcs_bench(total_bytes: int, n: int, bucket_mb: float, repeat: int, reuse: bool = True) -> dict:
    import ray

    from relax.weights import DCS

    @ray.remote(num_cpus=0)
    class Publisher:
        def __init__(self, dcs):
            torch.set_num_threads(1)
            self.dcs = dcs
            self.dcs.join("actor", serve=True, trainer=True)
            self.w = synthetic(total_bytes, n, 0)

        def publish(self, version):
            for t in self.w.values():
                t.add_(1.0)
            return self.dcs.publish(version, self.w)

    @ray.remote(num_cpus=0)
    class Receiver:
        def __init__(self, dcs):
            torch.set_num_threads(1)
            self.dcs = dcs
            self.dcs.join("rollout", serve=True)
            self.params = {k: torch.zeros_like(v) for k, v in synthetic(total_bytes, n, 0).items()}
            self.version = -1

        def load(self, state, version):
            for k, p in self.params.items():
                p.copy_(state[k])
            self.version = version

        def sync(self, version):
            t0 = time.perf_counter()
            self.dcs.sync(self.version, self.load, min_version=version)
            return time.perf_counter() - t0, self.dcs.last_transfer

    dcs = DCS.start("gloo", bucket_mb=bucket_mb, timeout_s=120, reuse_groups=reuse)
    try:
        pub, rec = Publisher.remote(dcs), Receiver.remote(dcs)
        rows = []
        for v in range(repeat + 1):
            publish_s = ray.get(pub.publish.remote(v))
            sync_s, tr = ray.get(rec.sync.remote(v))
            rows.append({"publish_s": publish_s, "sync_s": sync_s, "transfer_s": tr["seconds"]})
        ray.kill(pub)
        ray.kill(rec)
    finally:
        dcs.close()
    return rows[1:]  # the first transfer allocates the receiver's staging (first touch)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--mb", type=float, default=256)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, nargs="+", default=[16, 64, 256])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--groups", nargs="+", choices=["reused", "fresh"], default=["reused"],
                    help="process groups reused per pair (default) and/or made per transfer")
    ap.add_argument("--out", default=None)


def main(args: argparse.Namespace) -> int:
    from relax.cluster import RaySession

    nbytes = int(args.mb * 2**20)
    host = HostLoad().__enter__()

    raw = raw_broadcast(nbytes, args.repeat)
    result = {"payload_mb": args.mb, "tensors": args.tensors, "repeat": args.repeat, "cpus": os.cpu_count(),
              "load_avg_1m_before": host.record["loadavg_before"][0], "torch": torch.__version__, "dcs": []}
    with tempfile.TemporaryDirectory(prefix="relax-dcs-bench-", dir=".") as d:
        result["disk_reload"] = disk_reload(nbytes, args.tensors, args.repeat, Path(d))
    for mode in ("warm", "cold"):
        s = result["disk_reload"][mode]["median_s"]
        print(f"disk reload ({mode} page cache) {args.mb:g} MB: {s:.3f} s, {nbytes / s / 1e9:.2f} GB/s")

    with RaySession(num_cpus=4):
        for groups in args.groups:
            for bmb in args.bucket_mb:
                rows = dcs_bench(nbytes, args.tensors, bmb, args.repeat, reuse=groups == "reused")
                result["dcs"].append({"bucket_mb": bmb, "groups": groups, "all": rows})
    raw += raw_broadcast(nbytes, args.repeat)
    raw_s = min(raw)
    result["raw_broadcast"] = {"best_s": raw_s, "median_s": statistics.median(raw), "gb_per_s": nbytes / raw_s / 1e9,
                               "all_s": raw}
    print(f"raw gloo broadcast {args.mb:g} MB: {nbytes / raw_s / 1e9:.2f} GB/s (best of {len(raw)}; "
          f"median {nbytes / statistics.median(raw) / 1e9:.2f})")
    for entry in result["dcs"]:
        rows = entry["all"]
        best = {k: min(r[k] for r in rows) for k in rows[0]}
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        entry.update({"best": best, "median": med, "transfer_gb_per_s": nbytes / best["transfer_s"] / 1e9,
                      "sync_gb_per_s": nbytes / best["sync_s"] / 1e9, "transfer_vs_raw": raw_s / best["transfer_s"],
                      "sync_vs_raw": raw_s / best["sync_s"]})
        print(f"dcs bucket {entry['bucket_mb']:>6g} MB, {entry['groups']} groups: transfer {entry['transfer_gb_per_s']:.2f} GB/s "
              f"({100 * entry['transfer_vs_raw']:.0f}% of raw), sync incl. load {entry['sync_gb_per_s']:.2f} GB/s "
              f"({100 * entry['sync_vs_raw']:.0f}%), transfer {1000 * best['transfer_s']:.1f} ms, "
              f"publisher stall {1000 * best['publish_s']:.0f} ms; "
              f"sync {best['sync_s']:.3f} s vs disk reload {result['disk_reload']['cold']['median_s']:.3f} s cold")
    host.__exit__(None, None, None)
    result["load_avg_1m_after"] = host.record["loadavg_after"][0]
    out = write_bench(result, "dcs", args.out)
    print(f"load average {result['load_avg_1m_before']} -> {result['load_avg_1m_after']}; wrote {out}")
    return 0
