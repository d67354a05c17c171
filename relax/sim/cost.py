"""The cost model: the time of each unit of work from its size, the model's shapes and the hardware profile.

Rollout (one engine replica of `tp` devices, continuous batching): the active batch is bounded by the KV cache
(devices x memory x mem_fraction - weights, over KV bytes per token) and by max_running_requests. A decode step
takes max(bytes / (bandwidth x decode_bw), FLOPs / (peak x decode_flops)) + step overhead: bytes are the weights
it reads (MoE: the experts some token of the batch routes to) and every active request's KV cache; FLOPs are
2 x active params per token plus attention over the context. Prefill: 2 x active params per prompt token plus
causal attention, at prefill efficiency.

Training: 6 x active params x tokens plus causal attention (6 x layers x heads x head_dim x L^2 per sequence),
x 4/3 with full activation recompute, over devices x peak x MFU, stretched by the pipeline bubble; the step ends
with the data-parallel gradient all-reduce over the link and the optimizer's memory traffic. The layout adds, not
overlapped with compute: tensor-parallel activation collectives (sequence parallel: an all-gather and a
reduce-scatter per attention and per MLP block, each pass) over NVLink and, for MoE with expert parallelism, the
token dispatch + combine all-to-alls per layer and pass. Log-prob forwards:
a third of that (2 N and a forward's attention) at forward_mfu. Weight sync: the bf16 weights over the link
between the pools plus the engine's pause/flush. Colocate: sleep/wake moves the engine's weights over the host
link, plus a fixed part.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.config import ConfigError, ExperimentConfig
from relax.sim.hardware import HardwareProfile
from relax.sim.live import LiveEngine, _exact_sum_max
from relax.sim.shapes import ModelShape


@dataclass(frozen=True)
class SimOptions:
    band: str = "mid"  # low | mid | high: which end of each sourced band (efficiencies, overheads)
    recompute: bool = False  # full activation recompute in training (Megatron --recompute-granularity full)
    # Engine behaviour the simulator can assume beyond the config (rollout.max_inflight turns stream_groups on):
    stream_groups: bool = False  # a group lands on the bus when its last response finishes, not at the call's end
    inflight_groups: int | None = None  # groups one replica keeps in its engine at once (None: rollout.chunk_groups)
    # Training and log-prob forwards over the sequences' own tokens, as a trainer that packs them without padding
    # would (Megatron's THD layout under --use-dynamic-batch-size); ours pad each slice to its longest row
    # (relax.trainers.budget), which the simulator prices unless this is set.
    packed_sequences: bool = False


class CostModel:
    def __init__(self, cfg: ExperimentConfig, shape: ModelShape, hw: HardwareProfile,
                 options: SimOptions = SimOptions(), media_tokens: dict[str, float] | None = None):
        self.cfg, self.shape, self.hw, self.opt = cfg, shape, hw, options
        # One sample's media through the towers (the length model's media tokens per prompt): forward FLOPs, and
        # the FLOPs of a training pass over it (a frozen tower: one forward; a trained one: three passes).
        self.media_fwd, self.media_train = self._media_flops(media_tokens or {})
        b = options.band
        self.b = b
        d, e = hw.device, hw.efficiency
        self.peak, self.bw, self.mem = d.peak_flops.at(b), d.memory_bw.at(b), d.memory_bytes.at(b)
        self.per_node = int(d.per_node.value)
        self.eff = {name: v.at(b) for name, v in e}
        self.dtype_bytes = 2 if cfg.rollout.dtype == "bfloat16" or hw.kind == "gpu" else 4
        self.train_bytes = 2 if cfg.training.precision == "bf16" or hw.kind == "gpu" else 4
        self.devices = {role: self._devices(role) for role in ("rollout", "actor", "reference", "actor_fwd")}
        self.replicas = cfg.rollout.replicas
        self.replica_devices = max(self.devices["rollout"] / self.replicas, 1e-9)
        self._decode_cache: dict = {}
        self._touched_cache: dict = {}
        # What the work done implies, summed over a run (implied()): bytes decode steps read and the seconds of
        # engine calls; model FLOPs (3 passes, no recompute: the MFU convention) and seconds of training.
        self.acc = {"decode_bytes": 0.0, "generate_s": 0.0, "train_flops": 0.0, "train_s": 0.0}
        self._check_fits()
        self._check_threads()

    def _media_flops(self, media: dict[str, float]) -> tuple[float, float]:
        towers = {t.name: t for t in self.shape.towers}
        if unknown := sorted(set(media) - set(towers)):
            raise ConfigError(f"media_tokens: the model ({self.shape.source}) has no tower {', '.join(unknown)} "
                              f"(towers: {', '.join(towers) or 'none'})")
        fwd = {n: x * towers[n].forward_flops_per_token() for n, x in media.items()}
        return sum(fwd.values()), sum(f * (3.0 if towers[n].trained else 1.0) for n, f in fwd.items())

    # --- layout -------------------------------------------------------------------------------------------
    def _devices(self, role: str) -> float:
        r = getattr(self.cfg.resources, role)
        if self.hw.kind == "gpu":
            return float(r.gpus)
        # cpu: a measured profile prices one role's whole core share (`relax profile` times it at the config's threads)
        return 1.0 if (role != "actor_fwd" or self.cfg.algorithm.old_log_probs == "actor_fwd") else 0.0

    def role_devices(self, role: str) -> float:
        n = self.devices.get(role, 0.0)
        if n <= 0:
            raise ConfigError(f"resources.{role}.gpus: the {role} needs devices on hardware '{self.hw.name}' "
                              f"(got {n:g})")
        return n

    def link(self, a: str, b: str) -> float:
        """One-way bytes/s between two pools: intra-node when both fit in one node together (or colocate)."""
        if self.cfg.mode == "colocate" or self.hw.kind == "cpu":
            return self.hw.links.intra_node.at(self.b) * self.eff["link"]
        need = self.devices.get(a, 0) + self.devices.get(b, 0)
        one_node = need <= self.per_node
        raw = self.hw.links.intra_node if one_node else self.hw.links.inter_node
        return raw.at(self.b) * self.eff["link"]

    def _check_fits(self) -> None:
        if self.hw.kind == "gpu" and self.kv_capacity_tokens() < self.cfg.rollout.max_new_tokens:
            raise ConfigError(
                f"resources.rollout.gpus: a replica of {self.replica_devices:g} {self.hw.name} GPU(s) holds "
                f"{self.kv_capacity_tokens():.0f} KV tokens after the weights, less than one response "
                f"(rollout.max_new_tokens={self.cfg.rollout.max_new_tokens})")

    def _check_threads(self) -> None:
        """A measured CPU profile prices a role's span at the threads it was timed at: a role running another
        count would be priced at the wrong speed (and hold the wrong number of cores), so say which to re-measure."""
        measured = self.hw.threads
        if self.hw.kind != "cpu" or not measured:
            return
        roles = {"rollout": "rollout", "actor": "actor"}
        if self.cfg.algorithm.kl_coef > 0:
            roles["reference"] = "forward"
        if self.cfg.algorithm.old_log_probs == "actor_fwd":
            roles["actor_fwd"] = "forward"
        for role, work in roles.items():
            got, want = getattr(self.cfg.resources, role).threads, measured.get(work)
            if want is not None and got != want:
                raise ConfigError(f"resources.{role}.threads: {got}, but profile '{self.hw.name}' timed this work "
                                  f"({work}) at {want} thread(s); measure one for this config (relax profile CONFIG "
                                  f"--ray)")

    # --- rollout ------------------------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> float:
        return self.shape.total_params * self.dtype_bytes

    def kv_capacity_tokens(self) -> float:
        frac = self.hw.rollout.mem_fraction.at(self.b)
        free = self.replica_devices * self.mem * frac - self.weight_bytes
        return max(free, 0.0) / self.shape.kv_bytes_per_token(self.dtype_bytes)

    def decode_arms(self, batch: int) -> tuple[float, float, float, float]:
        """Step time at context C = max(a + b C, c + d C) + overhead: (a, b) memory arm, (c, d) compute arm."""
        key = batch
        if key not in self._decode_cache:
            s, n = self.shape, self.replica_devices
            bw = n * self.bw * self.eff["decode_bw"]
            fl = n * self.peak * self.eff["decode_flops"]
            a = s.expert_params_touched(batch) * self.dtype_bytes / bw
            bm = s.kv_bytes_per_token(self.dtype_bytes) / bw
            c = 2.0 * s.active_params * batch / fl
            dm = 4.0 * s.num_layers * s.attn_width / fl
            self._decode_cache[key] = (a, bm, c, dm)
        return self._decode_cache[key]

    @property
    def step_overhead(self) -> float:
        over = self.hw.rollout.step_overhead_s.at(self.b)
        if self.replica_devices > 1:  # two tensor-parallel all-reduces per layer, latency-bound at decode sizes
            over += 2 * self.shape.num_layers * self.hw.links.latency_s.at(self.b)
        return over

    def decode_time(self, batch: int, context: float, steps: int = 1) -> float:
        """`steps` decode steps of `batch` requests, the summed context growing by `batch` per step from
        `context`."""
        a, bm, c, dm = self.decode_arms(batch)
        return _exact_sum_max(a + bm * context, bm * batch, c + dm * context, dm * batch, steps) \
            + steps * self.step_overhead

    def prefill_time(self, prompt_lens: list[float]) -> float:
        s = self.shape
        tokens = sum(prompt_lens)
        flops = 2.0 * s.active_params * tokens + 2.0 * s.num_layers * s.attn_width * sum(p * p for p in prompt_lens)
        flops += len(prompt_lens) * self.media_fwd  # each request's media through the towers
        return flops / (self.replica_devices * self.peak * self.eff["prefill"])

    def generate(self, requests: list[tuple[float, int]], max_running: int | None = None) -> tuple[float, list[float]]:
        """One engine call: `requests` (prompt tokens, response tokens) under continuous batching on one replica.
        Returns (duration, finish time of each request). Admission is FIFO while the active batch stays under
        max_running_requests (and `max_running`, the caller's own cap, e.g. rollout.max_inflight) and its reserved
        KV (prompt + response of each) fits the cache (relax/sim/live.py)."""
        eng = LiveEngine(self, max_running)
        if len(requests) <= eng.max_run and sum(p + n for p, n in requests) <= eng.cap:
            out = self._generate_all_admitted(requests, self.step_overhead, self.decode_arms)
            self.acc["generate_s"] += out[0]
            return out
        return eng.run(requests)

    def _touched(self, batch: int) -> float:
        """Weight bytes one decode step of `batch` requests reads (cached per batch size)."""
        w = self._touched_cache.get(batch)
        if w is None:
            w = self._touched_cache[batch] = self.shape.expert_params_touched(batch) * self.dtype_bytes
        return w

    def _count_reads(self, weight_bytes: float, kv_token_steps: float) -> None:
        """Add one engine call's decode reads: weights touched, and KV tokens x steps (x bytes per KV token)."""
        self.acc["decode_bytes"] += weight_bytes + kv_token_steps * self.shape.kv_bytes_per_token(self.dtype_bytes)

    def _generate_all_admitted(self, requests, over, arms) -> tuple[float, list[float]]:
        """`generate` when every request fits at once: one prefill, then segments between finishes (the same
        arithmetic as the general path, without its queue and heap)."""
        prompts = [p for p, _ in requests]
        t = self.prefill_time(prompts)
        ends = [max(int(n), 1) for _, n in requests]  # the decode step each request finishes at
        order = sorted(range(len(requests)), key=ends.__getitem__)
        context = sum(prompts)
        finish = [0.0] * len(requests)
        step, b, j, n = 0, len(requests), 0, len(requests)
        w_read, kv_read, touched = 0.0, 0.0, self._touched
        while j < n:
            end = ends[order[j]]
            n_steps = end - step
            if n_steps > 0:
                a, bm, c, dm = arms(b)
                t += _exact_sum_max(a + bm * context, bm * b, c + dm * context, dm * b, n_steps) + n_steps * over
                w_read += n_steps * touched(b)
                kv_read += n_steps * context + b * n_steps * (n_steps - 1) / 2
                context += b * n_steps
                step = end
            while j < n and ends[order[j]] == step:
                i = order[j]
                finish[i] = t
                context -= prompts[i] + step
                b -= 1
                j += 1
        self._count_reads(w_read, kv_read)
        return t, finish

    # --- training and forwards --------------------------------------------------------------------------
    def _flops(self, tokens: float, sumsq: float, passes: float, rows: int = 0) -> float:
        """`passes` forwards over sequences of `tokens` tokens in all, `sumsq` the sum of their squared lengths
        (causal attention: 2 x layers x heads x head_dim x L^2 per sequence and forward), and the media of `rows`
        samples through the towers (a forward, or a training pass when passes > 1)."""
        s = self.shape
        towers = rows * (self.media_train if passes > 1 else self.media_fwd)
        return passes * (2.0 * s.active_params * tokens + 2.0 * s.num_layers * s.attn_width * sumsq) + towers

    def _parallel(self, role: str):
        from relax.config import role_parallel

        return role_parallel(self.cfg, role)

    def pipeline_stretch(self, role: str, micro_batches: float) -> float:
        pp = self._parallel(role).pipeline
        return 1.0 + (pp - 1) / max(micro_batches, 1.0)

    def _work(self, tokens: float, sumsq: float, padded: tuple[float, float] | None) -> tuple[float, float]:
        """What a pass computes: the padded sequences, unless the options assume a trainer that packs them."""
        return padded if padded is not None and not self.opt.packed_sequences else (tokens, sumsq)

    def train_time(self, tokens: float, sumsq: float, micro_batches_per_step: float = 1.0, rows: int = 0,
                   padded: tuple[float, float] | None = None) -> float:
        """One micro-batch's forward + backward over sequences of `tokens` tokens (`sumsq`: their squared lengths).
        `padded`: the (tokens, sumsq) the trainer computes once it pads them (relax.trainers.budget.padded_work):
        the time is theirs, the implied MFU counts only the sequences' own FLOPs."""
        passes = 4.0 if self.opt.recompute else 3.0
        mfu = self.eff["train_mfu_moe" if self.shape.moe else "train_mfu"]
        work = self._work(tokens, sumsq, padded)
        t = self._flops(*work, passes, rows) / (self.role_devices("actor") * self.peak * mfu)
        t += self.layout_comm_time(work[0], passes, "actor")
        t = t * self.pipeline_stretch("actor", micro_batches_per_step) + self._fixed("train_micro_batch_s")
        self.acc["train_flops"] += self._flops(tokens, sumsq, 3.0, rows)
        self.acc["train_s"] += t
        return t

    def forward_time(self, tokens: float, sumsq: float, role: str, rows: int = 0,
                     padded: tuple[float, float] | None = None) -> float:
        """A log-prob forward by `role` over these sequences (`padded`: as in train_time)."""
        work = self._work(tokens, sumsq, padded)
        return self._flops(*work, 1.0, rows) / (self.role_devices(role) * self.peak * self.eff["forward_mfu"]) \
            + self.layout_comm_time(work[0], 1.0, role) + self._fixed("forward_call_s")

    def layout_comm_time(self, tokens: float, passes: float, role: str) -> float:
        """Seconds of the layout's collectives for `tokens` tokens over `passes` passes (forward 1, backward 2,
        recompute 1 more): TP moves each layer's activations 4 times a pass ((tp-1)/tp of tokens x hidden bf16
        per rank, tokens split over DP and PP stages); EP sends each token's top-k copies out and back. Intra-node
        when the model-parallel group fits a node (it must for TP), else over the inter-node link."""
        if self.hw.kind != "gpu":
            return 0.0
        p, s = self._parallel(role), self.shape
        dp = max(int(self.role_devices(role)) // p.model_parallel, 1)
        layers = s.num_layers / p.pipeline  # a rank's stage
        per_rank = tokens / dp  # every TP rank of a DP replica sees all of its tokens (sequence parallel splits them)
        t, lat = 0.0, self.hw.links.latency_s.at(self.b)
        if p.tensor > 1:
            bw = self.hw.links.intra_node.at(self.b) * self.eff["link"]
            vol = 4 * layers * per_rank * s.hidden_size * self.train_bytes * (p.tensor - 1) / p.tensor
            t += passes * (vol / bw + 4 * layers * lat)
        if s.moe and p.expert > 1:
            raw = self.hw.links.intra_node if p.expert * p.etp <= self.per_node else self.hw.links.inter_node
            bw = raw.at(self.b) * self.eff["link"]
            # the tokens of one EP group (split over its TP ranks), each top-k times, dispatched and combined
            vol = 2 * layers * per_rank / p.tensor * s.experts_per_token * s.hidden_size * self.train_bytes \
                * (p.expert - 1) / p.expert
            t += passes * (vol / bw + 2 * layers * lat)
        return t

    def _fixed(self, name: str) -> float:
        v = getattr(self.hw.overheads, name)
        return v.at(self.b) if v is not None else 0.0

    def data_parallel(self, role: str = "actor") -> int:
        p = self._parallel(role)
        return max(int(self.role_devices(role)) // p.model_parallel, 1) if self.hw.kind == "gpu" else 1

    def optimizer_time(self) -> float:
        """Gradient all-reduce over the data-parallel group, then the optimizer's memory traffic per shard."""
        p = self._parallel("actor")
        shard = self.shape.total_params / (p.tensor * p.pipeline)
        dp = self.data_parallel()
        t = shard * self.hw.overheads.optimizer_bytes_per_param.at(self.b) / self.bw
        if dp > 1:
            devices = self.role_devices("actor")
            raw = self.hw.links.intra_node if devices <= self.per_node else self.hw.links.inter_node
            t += 2 * (dp - 1) / dp * shard * 4 / (raw.at(self.b) * self.eff["link"])
            t += 2 * (dp - 1) * self.hw.links.latency_s.at(self.b)
        return t

    def checkpoint_time(self) -> float:
        """The Actor's periodic checkpoint (relax.fault.checkpoint): fp32 weights (Megatron: its master copy, plus
        the trained low-precision weights) and Adam's two fp32 moments, the nodes of the Actor each writing its
        share."""
        bw = self.hw.overheads.checkpoint_bytes_per_s
        if bw is None:
            return 0.0
        per_param = 4 + 8 + (self.train_bytes if self.train_bytes != 4 else 0)
        nodes = -(-self.role_devices("actor") // self.per_node) if self.hw.kind == "gpu" else 1
        return self.shape.total_params * per_param / (max(nodes, 1) * bw.at(self.b))

    def micro_batch_tokens(self) -> int:
        """Tokens the trainer takes per micro-batch across its data-parallel ranks."""
        return self.cfg.training.micro_batch_tokens * self.data_parallel()

    # --- weights, sleep/wake, bus, control ----------------------------------------------------------------
    def publish_time(self) -> float:
        """Trainer side of a weight version: gather the bf16 weights and hand them to DCS."""
        return self.shape.total_params * 2 / (self.hw.links.intra_node.at(self.b) * self.eff["link"]) \
            + self.hw.overheads.rpc_s.at(self.b)

    def weight_load_time(self) -> float:
        """Rollout side: a replica receives the bf16 weights over the link and pauses/flushes."""
        return self.shape.total_params * 2 / self.link("actor", "rollout") \
            + self.hw.rollout.weight_load_pause_s.at(self.b)

    def sleep_time(self) -> float:
        per_device = self.weight_bytes / self.replica_devices
        return per_device / self.hw.links.host.at(self.b) + self.hw.overheads.sleep_wake_fixed_s.at(self.b) / 2

    def wake_time(self) -> float:
        return self.sleep_time() + self.weight_load_time()

    def rows_bytes(self, rows: int, prompt: float, response_tokens: float) -> float:
        """Bus bytes of `rows` rows of `prompt` tokens each and `response_tokens` in all: token ids (int64), rollout
        log-probs and one more float field per response token; with R3, each routed token's expert ids (uint8)."""
        b = (rows * prompt + response_tokens) * 8 + response_tokens * 4 * 2
        if self.cfg.moe.r3 and self.shape.moe:
            routed = (rows * prompt + response_tokens) if self.cfg.moe.r3_prompt else response_tokens
            b += routed * self.shape.num_layers * self.shape.experts_per_token
        return b

    def bus_time(self, rows: int, nbytes: float) -> float:
        o = self.hw.overheads
        call = (o.bus_call_s or o.rpc_s).at(self.b)
        return rows * o.bus_row_s.at(self.b) + nbytes / o.bus_bytes_per_s.at(self.b) + call

    def bus_parallel_cpu(self, rows: int) -> float:
        """Core-seconds a bus call of `rows` rows burns in other processes besides its caller's wall time (TQ's
        controller and storage, the bus coordinator): on a CPU profile they take a core from the roles."""
        return self._fixed("bus_parallel_cpu_s") + rows * self._fixed("bus_parallel_cpu_row_s")

    def core_share(self) -> float:
        """The share of a CPU profile's cores left to the roles by the idle session's background (Ray, the bus,
        DCS heartbeats): role work on fewer than every core takes 1 / core_share() of its time (Simulation.stretch).
        1 on a GPU profile."""
        if self.hw.kind != "cpu":
            return 1.0
        return max(1.0 - self._fixed("background_cores") / max(self.per_node, 1), 0.05)

    def notice_time(self) -> float:
        """A waiting consumer learns that rows landed: the producer's notice to the bus coordinator (one RPC)."""
        return self.hw.overheads.rpc_s.at(self.b)

    def reward_time(self, rows: int) -> float:
        return rows * self.hw.overheads.reward_per_sample_s.at(self.b)

    def advantages_time(self, rows: int) -> float:
        return rows * self.hw.overheads.advantages_per_row_s.at(self.b)

    @property
    def rpc(self) -> float:
        return self.hw.overheads.rpc_s.at(self.b)

    # --- what a reader judges the prediction by -----------------------------------------------------------
    def implied(self) -> dict:
        """The assumed efficiencies, and what the simulated work implies: `effective_train_mfu` = model FLOPs
        (6N + attention, no recompute) / (actor devices x peak x training seconds: after recompute, layout
        collectives and pipeline bubble); `effective_decode_bw_efficiency` = bytes decode steps read / (replica
        devices x peak bandwidth x engine-call seconds: after prefill, step overheads and compute-bound steps)."""
        a, g = self.acc, self.hw.kind == "gpu"
        eff_mfu = a["train_flops"] / (self.devices["actor"] * self.peak * a["train_s"]) if a["train_s"] and g else None
        eff_bw = a["decode_bytes"] / (self.replica_devices * self.bw * a["generate_s"]) if a["generate_s"] and g \
            else None
        return {"effective_train_mfu": None if eff_mfu is None else round(eff_mfu, 4),
                "effective_decode_bw_efficiency": None if eff_bw is None else round(eff_bw, 4),
                "train_mfu": self.eff["train_mfu_moe" if self.shape.moe else "train_mfu"],
                "forward_mfu": self.eff["forward_mfu"], "decode_bw_efficiency": self.eff["decode_bw"],
                "kv_capacity_tokens_per_replica": round(self.kv_capacity_tokens()) if self.hw.kind == "gpu" else None,
                "params_total": self.shape.total_params, "params_active": self.shape.active_params,
                "recompute": self.opt.recompute, "band": self.b}
