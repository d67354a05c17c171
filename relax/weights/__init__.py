"""DCS, the distributed checkpoint service: versioned weights that move between roles without disk.

One coordinator (a named async Ray actor) keeps the topology and the metadata; every role holds a client.

* `coordinator`: the registry of members (liveness: relax/fault/heartbeat.py), every version with its tensor
  metadata and bucket layout, which live member holds which version, the ledger of trained sample ids, and
  the pairing of each receiver with a holder.
* `client` (`DCS`): the handle roles use: `join`, `publish`, `sync` / follow, `last_transfer`.
* `transport`: how the bytes move. `transport: gloo` (default): a two-rank torch.distributed process group
  per (holder, receiver) pair (gloo on CPU tensors, NCCL when the staging lives on a GPU: same code) moves
  the staging bucket by bucket with `broadcast`; the group is made on the pair's first session and reused
  for every later version (`reuse_groups`). `transport: object_store` keeps the first version's data path
  (Ray object store) behind the same interface, for comparison. It also holds the one way Relax makes a
  TCPStore and a process group (the engine server's weight-update groups use it too).
* `layout`: flat per-dtype staging buffers (allocated once, reused for every version) and the bucket layout
  planned from the tensor metadata.

The driver is a member too: it pins version 0 (the reference policy) and follows the newest version, so
every version is held by a second process once published (a killed Actor loses nothing published), and a
version is committed (its samples count as trained) only once such a second holder has it.

Import from here (`from relax.weights import DCS`). The names resolve lazily, so that the engine server,
which needs only `transport`, does not import Ray.
"""

from __future__ import annotations

from relax.lazy import lazy_getattr

_HOME = {
    "DCS": "client",
    "Staging": "layout",
    "plan_layout": "layout",
    "model_tensors": "layout",
    "make_group": "transport",
    "new_process_group": "transport",
    "broadcast": "transport",
}
__all__ = list(_HOME)


__getattr__ = lazy_getattr(__name__, _HOME)
