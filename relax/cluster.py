"""The Ray cluster a run uses: the one place Ray is started (`RaySession`).

Local by default: a private instance in its own temp dir, always shut down, closed to the network: every Ray
process listens on 127.0.0.1 only and Ray's token authentication is on (a token private to this driver
process, never written to disk). With RAY_ADDRESS set, a cluster started with `ray start`, joined as a driver
and left running: its addresses, ports and token are the cluster's (README, "Network exposure").
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field

import ray

from relax.loopback import is_loopback

log = logging.getLogger(__name__)

# One token per driver process: Ray's C++ token loader caches the first token it reads, so every local session
# of this process uses the same one. Ray's processes inherit it through the environment.
_TOKEN = secrets.token_hex(32)
# Ray >= 2.5x binds its gRPC servers, agents and metrics port to the node IP (loopback ones to loopback only),
# but ray.init turns a loopback `_node_ip_address` into the machine's address. Only this switch (read by
# ray._private.services.get_node_ip_address, the driver's copy and, through the environment, Ray's own
# processes') makes a local node's IP 127.0.0.1.
_LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_SET_FOR_LOCAL = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", _LOOPBACK_VAR)


# What ray.init raises when a head process did not come up in time (the raylet; the GCS server's port file): an
# overloaded host, not a broken install, so RaySession tries again with a fresh session folder.
STARTUP_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")


@dataclass
class RaySession:
    """A private local Ray instance (own temp dir) that is always shut down; or, when RAY_ADDRESS is set (a
    cluster started with `ray start --head` / `ray start --address=HEAD:6379`, e.g. RAY_ADDRESS=auto on one of
    its nodes), that cluster, joined as a driver and left running."""

    num_cpus: int
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="relax-ray-", dir="/tmp"))
    address: str | None = field(default_factory=lambda: os.environ.get("RAY_ADDRESS") or None)
    num_gpus: int | None = None  # None: the GPUs Ray detects; N on a CPU machine: N logical GPUs (placement tests)

    def __enter__(self):
        if self.address:
            ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=True)
            return self
        self._closed_to_network()
        try:
            self._init_local()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _init_local(self) -> None:
        for attempt in range(5):
            try:
                ray.init(num_cpus=self.num_cpus, num_gpus=self.num_gpus, include_dashboard=False,
                         _temp_dir=self.temp_dir, logging_level=logging.WARNING, log_to_driver=True)
                break
            except Exception as err:  # a fixed time for the raylet and GCS to come up: short on a busy host
                if not any(m in str(err) for m in STARTUP_TIMEOUTS) or attempt == 4:
                    raise
                log.warning("ray.init: the node timed out during startup (host overloaded); trying again: %s", err)
                ray.shutdown()
        node_ip = ray.util.get_node_ip_address()
        if not is_loopback(node_ip):  # a Ray upgrade that ignores the switch must not open the run silently
            raise RuntimeError(f"ray.init: the local node took address {node_ip}, not loopback; refusing to run "
                               f"a local Ray reachable from the network")

    def _closed_to_network(self) -> None:
        """Loopback only and token auth on, for this session; `__exit__` puts the environment back."""
        from ray._private import ray_constants
        from ray._raylet import Config

        self._saved_env = {k: os.environ.get(k) for k in _SET_FOR_LOCAL}
        self._saved_cluster_flag = ray_constants.ENABLE_RAY_CLUSTER
        mode = os.environ.get("RAY_AUTH_MODE")
        if mode not in (None, "token"):
            log.warning("RAY_AUTH_MODE=%s ignored: a local run keeps Ray's token authentication on", mode)
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")  # the driver read RAY_AUTH_MODE at import; reload it (as ray.init does for its default)
        if not os.environ.get("RAY_AUTH_TOKEN_PATH"):  # a token file the user named is theirs to keep
            os.environ.setdefault("RAY_AUTH_TOKEN", _TOKEN)
        os.environ[_LOOPBACK_VAR] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False  # the driver's copy, read at import

    def __exit__(self, *exc):
        ray.shutdown()
        if not self.address:
            from ray._private import ray_constants
            from ray._raylet import Config

            for k, v in self._saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            ray_constants.ENABLE_RAY_CLUSTER = self._saved_cluster_flag
            Config.initialize("")
        shutil.rmtree(self.temp_dir, ignore_errors=True)

