"""DCS transport: how the bytes of a version move, and the one way Relax makes a torch.distributed group.

* `store` / `make_group`: a TCPStore and a standalone process group on it (no global torch.distributed
  state): gloo for CPU tensors, NCCL for GPU tensors. `new_process_group` is both at one address, as SGLang's
  `init_weights_update_group` rendezvous (rank 0 hosts the store); the engine server and the SGLang weight
  sender use it, and the DCS makes its pair groups with `make_group` on the coordinator's store.
* Pair groups (`transport: gloo`): a two-rank group per (holder, receiver) pair, named by the coordinator
  and made on both sides under that name (`PairGroups`); the holder broadcasts the staging bucket by bucket.
* `transport: object_store`: the first version's data path (Ray object store), kept for comparison.

This module does not import Ray at load time: the engine server process imports it for its groups.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from relax.loopback import is_loopback


# ---- stores and groups -------------------------------------------------------------------------------------
def store(host: str, port: int, *, master: bool, timeout_s: float, world_size: int | None = None,
          wait_for_workers: bool = True):
    """A TCPStore at host:port; `master` hosts it (port 0: any free port, read back from `.port`).

    The master listens on `host` only (torch's own server would listen on every interface): a local run's
    store is on 127.0.0.1, a cluster's on the node address it advertises."""
    listen_fd = None
    if master:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.bind(addr)
        sock.listen(128)
        port, listen_fd = sock.getsockname()[1], sock.detach()  # the store owns (and closes) the socket
    return dist.TCPStore(host, port, world_size, master, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=wait_for_workers, master_listen_fd=listen_fd)


def make_group(store, rank: int, world_size: int, backend: str, timeout_s: float | None = None,
               host: str | None = None):
    """A standalone process group on `store`: gloo (CPU tensors) or NCCL (GPU tensors).

    gloo: `host` pins its device to that address (else gloo's default device). `timeout_s=None` keeps the
    backend's own default timeout."""
    if backend == "gloo":
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else dist.default_pg_timeout
        if host is None:
            return dist.ProcessGroupGloo(store, rank, world_size, timeout)
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        opts._timeout = timeout
        return dist.ProcessGroupGloo(store, rank, world_size, opts)
    if backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("nccl: the tensors are on a GPU but this torch build has no NCCL")
        if timeout_s is None:
            return nccl(store, rank, world_size)
        opts = nccl.Options()
        opts._timeout = timedelta(seconds=timeout_s)
        return nccl(store, rank, world_size, opts)
    raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")


def new_process_group(backend: str, master_address: str, master_port: int, rank: int, world_size: int,
                      timeout_s: float = 300.0):
    """A process group of `world_size` ranks meeting at master_address:master_port (rank 0 hosts the store).

    A loopback master means every rank is on this machine: gloo then listens on loopback too (its default
    device is the machine's address)."""
    st = store(master_address, master_port, master=rank == 0, timeout_s=timeout_s, world_size=world_size)
    return make_group(st, rank, world_size, backend, timeout_s,
                      host=master_address if is_loopback(master_address) else None)


def broadcast_buckets(pg, buffers: list[torch.Tensor], root: int) -> None:
    """Move every bucket from `root` to the other ranks; the bucket calls are queued back to back."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    works = [pg.broadcast([buf], opts) for buf in buffers]
    for w in works:
        w.wait()


def broadcast(pg, tensor: torch.Tensor, root: int = 0) -> None:
    broadcast_buckets(pg, [tensor], root)


# ---- DCS pair groups -----------------------------------------------------------------------------------------
def make_pair_group(store, name: str, rank: int, timeout_s: float, device: str, host: str):
    """A two-rank process group for one transfer session: gloo for CPU staging, NCCL for GPU staging."""
    prefixed = dist.PrefixStore(f"dcs/{name}/", store)
    if device == "cuda":
        return make_group(prefixed, rank, 2, "nccl")  # NCCL's default timeout, not timeout_s (as it always was)
    return make_group(prefixed, rank, 2, "gloo", timeout_s, host=host)


PRESENCE_POLL_S = 0.05  # how often a pair's rendezvous looks for its peer's presence key
PEER_CHECK_S = 1.0  # ... and asks whether the session was abandoned (its peer marked dead)


class PairGroups:
    """This process's ends of its pair groups, one per (peer, my rank), each reused while the coordinator names
    the same group; made by that name on both sides (a rendezvous through the coordinator's store).

    Rank 0 is the holder (`send`), rank 1 the receiver (`receive`). Before a new group is made each side posts a
    presence key and waits for the other's, asking `abandoned(sess)` every PEER_CHECK_S: a peer that died before
    the rendezvous (the supervisor marks it dead, which fails its sessions) costs about a second, not the whole
    timeout_s the group's own rendezvous would wait, during which a holder serves nobody else."""

    def __init__(self, store_addr: tuple[str, int], timeout_s: float, staging_device: str, abandoned=None):
        self.store_addr = store_addr
        self.timeout_s = timeout_s
        self.abandoned = abandoned
        self.device = "cuda" if staging_device.startswith("cuda") else "cpu"
        self._tls = threading.local()
        self._groups: dict[tuple[str, int], tuple[str, object]] = {}  # (peer, my rank) -> (group name, group)
        self.made = 0

    def _store(self):
        """A TCPStore client per thread (store clients are not shared between threads)."""
        st = getattr(self._tls, "store", None)
        if st is None:
            host, port = self.store_addr
            st = store(host, port, master=False, timeout_s=self.timeout_s)
            self._tls.store = st
        return st

    def group(self, sess: dict, rank: int):
        peer = sess["dst"] if rank == 0 else sess["src"]
        got = self._groups.get((peer, rank))
        if got is not None and got[0] == sess["group"]:
            return got[1]
        self._meet(sess, rank)
        pg = make_pair_group(self._store(), sess["group"], rank, self.timeout_s, self.device, self.store_addr[0])
        self.made += 1
        self._groups[(peer, rank)] = (sess["group"], pg)
        return pg

    def _meet(self, sess: dict, rank: int) -> None:
        st, name = self._store(), f"dcs/{sess['group']}/present/"
        st.set(f"{name}{rank}", "1")
        t0 = checked = time.time()
        while not st.check([f"{name}{1 - rank}"]):
            now = time.time()
            if now - t0 > self.timeout_s:
                raise TimeoutError(f"dcs: the peer of session {sess['sid']} did not come within {self.timeout_s} s")
            if self.abandoned is not None and now - checked >= PEER_CHECK_S:
                checked = now
                if self.abandoned(sess):
                    raise RuntimeError(f"dcs: session {sess['sid']} was abandoned (its peer is gone)")
            time.sleep(PRESENCE_POLL_S)

    def drop(self, sess: dict, rank: int) -> None:
        """Forget the pair's group after a failed session (it may be half-way through a collective)."""
        peer = sess["dst"] if rank == 0 else sess["src"]
        self._groups.pop((peer, rank), None)

    def send(self, sess: dict, buffers: list[torch.Tensor]) -> None:
        broadcast_buckets(self.group(sess, 0), buffers, root=0)

    def receive(self, sess: dict, buffers: list[torch.Tensor]) -> None:
        broadcast_buckets(self.group(sess, 1), buffers, root=0)


# ---- object_store ----------------------------------------------------------------------------------------------
def object_store_put(tensors: dict[str, torch.Tensor]) -> list:
    """The publisher's copy into the Ray object store: the refs the coordinator hands to receivers."""
    import ray  # here, not at the top: see the module doc

    return [ray.put({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()})]


def object_store_get(refs: list) -> dict[str, torch.Tensor]:
    import ray

    return ray.get(refs[0])
