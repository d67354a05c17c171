"""The Ray cluster a run uses: the one place Ray is started (`RaySession`).

Local by default: a private instance in its own temp dir, always shut down. With RAY_ADDRESS set, a cluster
started with `ray start`, joined as a driver and left running.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import ray

log = logging.getLogger(__name__)


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
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token written under ~/.ray for a local run
        for attempt in range(3):
            try:
                ray.init(num_cpus=self.num_cpus, num_gpus=self.num_gpus, include_dashboard=False,
                         _temp_dir=self.temp_dir, logging_level=logging.WARNING, log_to_driver=True)
                return self
            except Exception as err:  # Ray gives its raylet 30 s to come up: too short on an overloaded host
                if "timed out during startup" not in str(err) or attempt == 2:
                    raise
                log.warning("ray.init: the node timed out during startup (host overloaded); trying again")
                ray.shutdown()
        return self

    def __exit__(self, *exc):
        ray.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

