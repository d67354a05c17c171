"""Emulated GPUs: the real engine (processes, bus, DCS, supervisor, schedules, faults, API) on this machine, with
each unit of GPU work taking the time the relax/sim cost model gives for it on a hardware profile, over a stated
compression factor (`emulate` section; `relax run CONFIG --emulate h800`).

- `engine_config(cfg)`: the config that actually runs. The experiment as written (its model shape, GPU pools,
  parallel layout, engine, trainer) is kept in `emulate.target`, which prices the work; what runs is a tiny
  Qwen3 (plain torch) with the char tokenizer (so DCS and the bus move real, small state), the torch trainer, the emulated
  engine (relax/emulate/engine.py), no real GPUs (resources.*.gpus 0: Ray places nothing on GPUs) and a local
  prompt generator (the prompts' text does not matter: tokens are synthetic).
- `Emulator`: per process, the cost model and the sim's response lengths for the target (the same draw as
  `relax simulate`, so a sample's modelled length is a function of its sample id). `pace(kind, seconds)` wraps
  a unit of real work and sleeps until it has taken `seconds / compression`; work that took longer is counted
  as an overrun (the real machine could not keep up with the model).
Not compressed: CPU work (reward, advantages, the bus, Ray calls, process starts) runs at its real speed, so in
emulated hardware seconds (real x compression) it weighs `compression` times more than on the cluster.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from collections import defaultdict
from contextlib import contextmanager

from relax.config import ConfigError, ExperimentConfig, validate
from relax.trainers.budget import padded_work

# The stand-in policy: as small as the char tokenizer allows (its weights are what DCS moves for real), in plain
# torch (relax/models/native_qwen3.py): its real milliseconds weigh `compression` modelled ones, and every model
# process would otherwise import transformers (~3 s of CPU each).
TINY_MODEL = {"kind": "tiny_qwen3", "implementation": "native", "tokenizer": "char", "hidden_size": 32,
              "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
STAND_IN_TASK = {"kind": "text", "name": "basic_arithmetic", "params": {}, "size": 512, "eval_size": 0,
                 "reward": "reasoning_gym", "prompt_template": "{question} Answer:"}


def emu_name(hardware: str) -> str:
    from pathlib import Path

    return Path(hardware).stem


def enabled(cfg: ExperimentConfig) -> bool:
    return cfg.emulate.hardware is not None


def supervised(cfg: ExperimentConfig) -> bool:
    """Replicas are processes of their own (async relax); else one process stands in for every replica."""
    return cfg.mode == "async" and cfg.schedule == "relax"


def engine_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The CPU config that runs an emulation of `cfg` (emulate.hardware set); `cfg` itself goes into
    emulate.target. Errors name the field (an unknown profile, a config the cost model cannot price)."""
    if cfg.emulate.target is not None:
        return cfg  # already the stand-in
    e = cfg.emulate
    target = cfg.model_dump(mode="json")
    Emulator(cfg, target=cfg)  # prices the target now: a bad profile or length model fails before anything starts
    raw = copy.deepcopy(target)
    max_new = raw["rollout"]["max_new_tokens"]
    real_max = max(1, math.ceil(max_new / e.token_scale))
    raw["model"] = {**TINY_MODEL, "max_position": max(256, 2 * (real_max + 64))}
    raw["warmup"] = {"steps": 0}
    # its own run folder, <experiment>/<profile>-emu-<hardware>/, never mistaken for a cluster run's
    raw["profile"] = f"{raw['profile']}-emu-{emu_name(e.hardware)}"
    raw["task"] = dict(STAND_IN_TASK)
    r = raw["rollout"]
    r.update(engine="torch", engine_urls=[], max_new_tokens=real_max, dtype="float32")
    if not supervised(cfg):
        # One process stands in for every replica: the whole partition in one call, which the engine prices as
        # rollout.replicas virtual engines taking chunk_groups groups each (as `relax simulate` does).
        r.update(replicas=1, chunk_groups=r["prompts_per_step"])
    emu = Emulator(cfg, target=cfg)
    raw["training"] = {**raw["training"], "trainer": "torch", "parallel": {}, "forward_parallel": None,
                       "precision": "fp32",
                       "micro_batch_tokens": max(16, math.ceil(emu.cost.micro_batch_tokens() / e.token_scale))}
    for name, res in raw["resources"].items():
        raw["resources"][name] = {**res, "gpus": 0.0, "workers": None, "threads": 1, "cpus": min(res["cpus"], 0.25)}
    raw["moe"] = {**raw["moe"], "r3": False}  # the stand-in is dense; R3's bytes are priced from the target
    raw["dcs"] = {**raw["dcs"], "device": "cpu"}
    raw["emulate"] = {**raw["emulate"], "target": target}
    try:
        return validate(raw)
    except ConfigError as err:
        raise ConfigError(f"emulate: the CPU stand-in of this experiment does not validate: {err}") from None


class Emulator:
    """The target's cost model and response lengths, and the pacing of real work to modelled time."""

    def __init__(self, cfg: ExperimentConfig, target: ExperimentConfig | None = None):
        from relax.sim import build

        e = cfg.emulate
        self.target = target or validate(e.target)
        try:
            self.sim = build(self.target, e.hardware, band=e.band, lengths=e.lengths, record=False)
        except ConfigError as err:
            msg = str(err).replace("--hardware:", "emulate.hardware:")
            raise ConfigError(msg if msg.startswith("emulate") else f"emulate ({e.hardware}): {msg}") from None
        self.cost = self.sim.cost
        self.compression, self.scale = e.compression, e.token_scale
        self.P, self.G, self.steps = self.sim.P, self.sim.G, self.sim.steps
        self.prompt = self.sim.prompt  # modelled prompt tokens (the length model's)
        self.cap = self.target.rollout.max_new_tokens
        self.real_cap = max(1, math.ceil(self.cap / self.scale))
        # kind -> [calls, modelled seconds, overrun real seconds] (this process)
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])

    # --- lengths ---------------------------------------------------------------------------------------------
    def length(self, sample_id: int) -> int:
        """Modelled response tokens of a sample (its step, group and index in the sim's draw)."""
        k, rem = divmod(int(sample_id), self.P * self.G)
        g, j = divmod(rem, self.G)
        return self.sim.resp[k % self.steps][g][j]

    def limits(self, k: int, groups) -> list[int]:
        """Modelled response lengths of every sample of these groups of partition k, in row order."""
        return [self.sim.resp[k % self.steps][g][j] for g in groups for j in range(self.G)]

    def real_len(self, modelled: int) -> int:
        return min(self.real_cap, max(1, math.ceil(modelled / self.scale)))

    def seqs(self, sample_ids) -> list[float]:
        """Modelled sequence lengths (prompt + response) of these samples, in order."""
        return [self.prompt + self.length(s) for s in sample_ids]

    @staticmethod
    def work(seqs: list[float]) -> tuple[float, float]:
        """(sequence tokens, sum of squared sequence lengths) of these sequence lengths."""
        return sum(seqs), sum(x * x for x in seqs)

    def forward_time(self, sample_ids, role: str) -> float:
        """Modelled seconds of `role`'s log-prob forward over these samples (their media through the towers too),
        cut and padded as the target's forwards would be (its micro_batch_tokens)."""
        seqs = self.seqs(sample_ids)
        padded = padded_work(seqs, self.target.training.micro_batch_tokens)
        return self.cost.forward_time(*self.work(seqs), role, rows=len(seqs), padded=padded)

    def train_time(self, sample_ids, k: int) -> float:
        """Modelled seconds of one training micro-batch of these samples of partition k (padded to its longest)."""
        seqs = self.seqs(sample_ids)
        return self.cost.train_time(*self.work(seqs), self.micro_batches(k), rows=len(seqs), padded=padded_work(seqs))

    def response_tokens(self, sample_ids) -> int:
        return sum(self.length(s) for s in sample_ids)

    def rows_bytes(self, sample_ids) -> float:
        """Bus bytes the target would move for these rows (the cost model's row layout)."""
        ids = list(sample_ids)
        return self.cost.rows_bytes(len(ids), self.prompt, self.response_tokens(ids))

    def micro_batches(self, k: int) -> float:
        """Micro-batches per data-parallel rank of partition k (the pipeline bubble's divisor)."""
        return self.sim.expected_micro_batches(k % self.steps)

    # --- engine calls ----------------------------------------------------------------------------------------
    def generate_time(self, lengths: list[int], replicas: int = 1,
                      chunk: int | None = None) -> tuple[float, list[float]]:
        """Seconds of one engine call on the target and each request's finish time. `replicas` > 1: the call
        stands in for that many engines, each taking the next `chunk` requests when it is free (the sim's
        GroupQueue claims); finish times are then those of the engine that ran each request."""
        reqs = [(self.prompt, L) for L in lengths]
        if replicas <= 1:
            return self.cost.generate(reqs)
        free = [(0.0, r) for r in range(replicas)]
        fin = [0.0] * len(reqs)
        chunk = chunk or len(reqs)
        for lo in range(0, len(reqs), chunk):
            t, r = heapq.heappop(free)
            d, f = self.cost.generate(reqs[lo:lo + chunk])
            fin[lo:lo + chunk] = [t + x for x in f]
            heapq.heappush(free, (t + d, r))
        return max(t for t, _ in free), fin

    def reload_time(self, role: str) -> float:
        """Modelled GPU side of bringing a restarted role back (added on top of its real recovery seconds):
        its bf16 weights over the link from a live DCS peer into the fresh process (a rollout engine: its weight
        load, with the pause); the Actor also reloads its optimizer state (fp32 master weights and two Adam
        moments, 12 bytes per parameter: assumed) over each of its GPUs' host link, sharded over them."""
        c = self.cost
        if role == "rollout":
            return c.weight_load_time()
        weights = c.shape.total_params * 2 / c.link("actor", role if role != "actor" else "rollout")
        if role != "actor":
            return weights
        return weights + c.shape.total_params * 12 / (c.role_devices("actor") * c.hw.links.host.at(c.b))

    # --- pacing ----------------------------------------------------------------------------------------------
    @contextmanager
    def pace(self, kind: str, modelled_s: float):
        """The body's real work, then a sleep until `modelled_s / compression` has passed since it began."""
        t0 = time.time()
        yield
        self.wait_until(t0, modelled_s, kind)

    def wait_until(self, t0: float, modelled_s: float, kind: str) -> None:
        left = t0 + modelled_s / self.compression - time.time()
        tot = self.totals[kind]
        tot[0] += 1
        tot[1] += modelled_s
        if left > 0:
            time.sleep(left)
        else:
            tot[2] += -left

    def take_totals(self) -> dict[str, dict]:
        """This process's paced work since the last call: {kind: {calls, modelled_s, overrun_s}}."""
        out = {k: {"calls": int(v[0]), "modelled_s": round(v[1], 4), "overrun_s": round(v[2], 4)}
               for k, v in self.totals.items()}
        self.totals.clear()
        return out

    def describe(self) -> dict:
        """What summary.json says of the emulation."""
        hw, t = self.cost.hw, self.target
        return {"hardware": hw.name, "description": hw.description, "compression": self.compression,
                "band": self.cost.b, "token_scale": self.scale, "target_profile": t.profile,
                "target_model": self.cost.shape.source, "params_total": self.cost.shape.total_params,
                "gpus": {r: getattr(t.resources, r).gpus for r in ("actor", "rollout", "reference", "actor_fwd")},
                "engine": t.rollout.engine, "trainer": t.training.trainer, "replicas": t.rollout.replicas,
                "lengths": self.sim.lengths.source, "prompt_tokens": round(self.prompt, 1)}


_CACHE: dict[str, Emulator] = {}


def emulator(cfg: ExperimentConfig) -> Emulator | None:
    """This process's Emulator for `cfg` (None when the run is not emulated)."""
    if not enabled(cfg) or cfg.emulate.target is None:
        return None
    key = cfg.emulate.model_dump_json()
    if key not in _CACHE:
        _CACHE[key] = Emulator(cfg)
    return _CACHE[key]


@contextmanager
def paced(cfg: ExperimentConfig, kind: str, modelled):
    """`Emulator.pace` when `cfg` is emulated (`modelled(emu)` gives the seconds), else nothing."""
    emu = emulator(cfg)
    if emu is None:
        yield
        return
    with emu.pace(kind, modelled(emu)):
        yield
