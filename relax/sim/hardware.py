"""Hardware profiles: the numbers the cost model prices work with, as data (`relax/sim/hardware/<name>.yaml`).

Every number is a `Sourced` value: `value`, the `source` it comes from (a datasheet, a public report, `relax
profile` on the machine, or the word "assumed"), and optionally a plausible `low`/`high` band. A profile
error names the field, e.g. `h800.yaml: efficiency.train_mfu.value: Input should be greater than 0`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relax.config import ConfigError

HERE = Path(__file__).resolve().parent / "hardware"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sourced(_Strict):
    value: float = Field(..., ge=0)
    source: str = Field(..., min_length=3)
    low: float | None = Field(None, ge=0)
    high: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _band(self) -> "Sourced":
        if self.low is not None and self.low > self.value:
            raise ValueError(f"low ({self.low:g}) is above value ({self.value:g})")
        if self.high is not None and self.high < self.value:
            raise ValueError(f"high ({self.high:g}) is below value ({self.value:g})")
        return self

    @property
    def assumed(self) -> bool:
        return self.source.strip().lower().startswith("assumed")

    def at(self, band: str) -> float:
        """The value at `band` (low, mid, high); a number without a band is the same at every point."""
        if band == "low" and self.low is not None:
            return self.low
        if band == "high" and self.high is not None:
            return self.high
        return self.value



class Device(_Strict):
    """One accelerator (or, for kind cpu, the cores a role gets)."""

    peak_flops: Sourced  # dense bf16 tensor FLOP/s (cpu: measured matmul FLOP/s of one role's threads)
    memory_bytes: Sourced
    memory_bw: Sourced  # bytes/s of HBM (cpu: DRAM copy bandwidth)
    per_node: Sourced  # devices per node (cpu: the cores all roles share; the simulator queues work for them)

    @model_validator(mode="after")
    def _positive(self) -> "Device":
        for name in ("peak_flops", "memory_bytes", "memory_bw", "per_node"):
            if getattr(self, name).value <= 0:
                raise ValueError(f"{name}.value must be > 0")
        return self


class Links(_Strict):
    """Bytes/s one way, per device."""

    intra_node: Sourced  # NVLink (cpu: loopback / shared memory)
    inter_node: Sourced  # InfiniBand / RoCE per device
    host: Sourced  # device <-> host memory (PCIe); colocate sleep/wake moves state over it
    latency_s: Sourced  # one collective or message's fixed cost


class Efficiency(_Strict):
    """Fractions of peak actually reached; each names the report it comes from or says "assumed"."""

    train_mfu: Sourced  # dense training: model FLOPs / (devices x peak)
    train_mfu_moe: Sourced  # MoE training (active parameters' FLOPs)
    forward_mfu: Sourced  # log-prob forwards (reference, actor_fwd, old log-probs)
    prefill: Sourced  # rollout prefill FLOP efficiency
    decode_bw: Sourced  # rollout decode: achieved / peak memory bandwidth
    decode_flops: Sourced  # rollout decode when compute-bound
    link: Sourced  # achieved / peak link bandwidth for bulk transfers (weights, gradients)

    @model_validator(mode="after")
    def _fractions(self) -> "Efficiency":
        for name, v in self:
            if not 0 < v.value <= 1 or (v.high is not None and v.high > 1):
                raise ValueError(f"{name}: an efficiency must lie in (0, 1], got {v.value:g}")
        return self


class Rollout(_Strict):
    mem_fraction: Sourced  # of device memory the engine holds (weights + KV cache)
    max_running_requests: Sourced  # the engine's cap on the active batch, whatever the KV cache allows
    step_overhead_s: Sourced  # per decode step: scheduling, sampling, launch (not bytes or FLOPs)
    weight_load_pause_s: Sourced  # pause + flush of the engine around a weight update (besides the bytes)


class Overheads(_Strict):
    rpc_s: Sourced  # one control RPC (Ray actor round trip)
    bus_row_s: Sourced  # bus put+get per row
    # Fixed cost of one bus put+get (metadata round trips to TransferQueue's controller and the gate) besides its
    # rows; measured by `relax profile --ray`. Absent: one control RPC (rpc_s) stands in for it.
    bus_call_s: Sourced | None = None
    bus_bytes_per_s: Sourced  # bus payload bandwidth
    # A CPU profile's cores are shared with the run's infrastructure (`relax profile --ray` measures both; absent: 0,
    # as on a GPU cluster, where they run on host cores the GPU work does not use): the core-seconds a bus put +
    # fetch burns in the bus's own processes (relax.bus.PROCESSES) besides its callers' time, per call and per row,
    # and the busy cores of an idle session (Ray, the bus, DCS heartbeats and long polls).
    bus_parallel_cpu_s: Sourced | None = None
    bus_parallel_cpu_row_s: Sourced | None = None
    background_cores: Sourced | None = None
    sleep_wake_fixed_s: Sourced  # colocate: fixed part of one sleep + wake (allocator, graphs), besides the bytes
    optimizer_bytes_per_param: Sourced  # memory traffic of one optimizer step per parameter (Adam, fp32 master)
    reward_per_sample_s: Sourced  # rule reward (math-verify) per sample, on a CPU worker
    advantages_per_row_s: Sourced
    # Fixed cost of one trainer micro-batch / one log-prob forward call besides its FLOPs (Python, kernel launch):
    # what dominates tiny models on a CPU. Measured by `relax profile`; absent (0) in the GPU datasheet profiles.
    train_micro_batch_s: Sourced | None = None
    forward_call_s: Sourced | None = None
    # Bytes/s one Actor node writes its share of the periodic checkpoint (health.checkpoint_every: optimizer state and
    # weights) at. Absent: the checkpoint costs nothing.
    checkpoint_bytes_per_s: Sourced | None = None


class HardwareProfile(_Strict):
    name: str
    kind: Literal["gpu", "cpu"] = "gpu"
    description: str = ""
    measured: bool = False  # written by `relax profile` on the machine itself
    # A measured CPU profile: the torch threads its work was timed at (rollout: engine calls; actor: training and
    # the matmul peak; forward: log-prob forwards). On 2 cores 2 threads run a span ~1.4x faster than 1, so the
    # cost model refuses a config whose roles run other thread counts (CostModel._check_threads).
    threads: dict[Literal["rollout", "actor", "forward"], int] | None = None
    device: Device
    links: Links
    efficiency: Efficiency
    rollout: Rollout
    overheads: Overheads

    def assumptions(self) -> list[str]:
        """Dotted names of every number whose source is "assumed"."""
        out = []
        for section in ("device", "links", "efficiency", "rollout", "overheads"):
            for name, v in getattr(self, section):
                if isinstance(v, Sourced) and v.assumed:
                    out.append(f"{section}.{name}")
        return out


# What an emulated run (relax/emulate) does for real on the machine it runs on, uncompressed: Ray calls, the bus,
# the reward and the advantages. Everything else it paces to the target's cost model.
HOST_WORK = ("rpc_s", "bus_row_s", "bus_call_s", "bus_bytes_per_s", "reward_per_sample_s", "advantages_per_row_s")
HOST_RATES = ("bus_bytes_per_s",)  # per second: compression divides them


def on_host(target: HardwareProfile, host: dict, compression: float) -> HardwareProfile:
    """`target` as an emulated run of it at `compression` meets it: its GPUs, links and GPU-side overheads, and the
    host work (HOST_WORK) at this machine's measured cost (`host`: relax.sim.measure.host_overheads) in emulated
    seconds, i.e. `compression` times heavier. The simulator on it predicts the emulated run, not a cluster."""
    raw = target.model_dump(mode="json", exclude_none=True)
    for name in HOST_WORK:
        v = Sourced.model_validate(host[name])
        value = v.value / compression if name in HOST_RATES else v.value * compression
        raw["overheads"][name] = {"value": value, "source": f"{v.source}; this host, in emulated seconds "
                                  f"(x{compression:g} compression)"}
    raw.update(name=f"{target.name}-on-host", measured=False,
               description=f"{target.description}; host work (Ray calls, bus, reward) at this machine's measured "
                           f"cost x{compression:g}: what an emulated run of it pays")
    return HardwareProfile.model_validate(raw)


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_hardware(name_or_path: str | Path | HardwareProfile) -> HardwareProfile:
    """A profile by name (`h800`, from relax/sim/hardware/) or by path to a YAML file (a profile: itself)."""
    if isinstance(name_or_path, HardwareProfile):
        return name_or_path
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = HERE / f"{name_or_path}.yaml"
        if not p.exists():
            raise ConfigError(f"--hardware: no profile '{name_or_path}' (one of {', '.join(available())}, or a "
                              f"path to a YAML file)")
    raw = yaml.safe_load(p.read_text()) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p.name}: top level must be a mapping")
    try:
        return HardwareProfile.model_validate(raw)
    except ValidationError as err:
        lines = [f"{p.name}: {'.'.join(str(x) for x in e['loc']) or '<profile>'}: {e['msg']}" for e in err.errors()]
        raise ConfigError("invalid hardware profile:\n  " + "\n  ".join(lines)) from None


def dump_hardware(profile: HardwareProfile) -> str:
    return yaml.safe_dump(profile.model_dump(mode="json", exclude_none=True), sort_keys=False)
