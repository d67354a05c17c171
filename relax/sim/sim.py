"""The discrete-event simulator (SimPy) of each schedule the engine runs, priced by the cost model.

One SimPy process per lane, doing what that lane does in the real engine, in the same order:
- relax async (relax/roles/, relax/api/pool.py): each rollout replica claims chunks of `chunk_groups` groups from
  the lowest open partition it may start, enters partition k through the staleness gate (`relax.bus.gate.can_start`,
  the Coordinator's own predicate) with weights >= k - max_staleness, and between chunks loads a newer version
  (several replicas); a chunk's rows land on the bus when its engine call ends. With rollout.max_inflight a
  replica is one engine kept full (relax/sim/live.py) that claims groups as slots free, across claims and
  partitions, and each group lands as its last sample ends (refill_replica, as relax/roles/stream.py).
  Reward, Reference and ActorFwd stream groups as they land, Advantages follows the rewards; the Actor trains
  micro-batches of whole groups as they become ready (StreamingLoader), then all-reduce + optimizer, publish,
  mark_trained.
- relax colocate (Controller.run_colocate): wake (k > 0), generate, sleep, then reward, reference, advantages and
  the Actor one after another on the shared devices.
- veRL one-step-off-policy and OpenRLHF async, as relax/schedules/verl.py and openrlhf.py emulate them.
Spans carry the names the real roles record (relax/schedules/spans.py), so the critical-path analysis reads a
simulated trace like a measured one.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import simpy

from relax.bus.gate import can_start
from relax.config import ConfigError, ExperimentConfig
from relax.fault.checkpoint import checkpoint_due
from relax.sim.cost import CostModel
from relax.sim.lengths import LengthModel
from relax.sim.live import LiveEngine
from relax.trainers.budget import padded_work


@dataclass
class Span:
    role: str
    name: str
    step: int | None
    start: float
    end: float
    args: dict = field(default_factory=dict)


class SimGate:
    """The bus Coordinator's staleness gate in simulated time: `oldest` advances as the Coordinator's
    mark_trained advances it; a waiter is admitted when `can_start` (relax/bus/gate.py) says so."""

    def __init__(self, env: simpy.Environment, max_staleness: int):
        self.env, self.s = env, max_staleness
        self.oldest, self.trained = 0, set()
        self.waiters: list[tuple[int, simpy.Event]] = []

    def admits(self, step: int) -> bool:
        return can_start(step, self.oldest, self.s)

    def wait_can_start(self, step: int) -> simpy.Event:
        ev = self.env.event()
        if self.admits(step):
            ev.succeed()
        else:
            self.waiters.append((step, ev))
        return ev

    def mark_trained(self, step: int) -> None:
        if step >= self.oldest:
            self.trained.add(step)
        while self.oldest in self.trained:
            self.trained.remove(self.oldest)
            self.oldest += 1
        still = []
        for step_w, ev in self.waiters:
            (ev.succeed() if self.admits(step_w) else still.append((step_w, ev)))
        self.waiters = still


class Ready:
    """Groups of each partition whose field is written, as a count: every stage takes groups in the order they
    landed on the bus, so what a field has ready is always a prefix of that order."""

    def __init__(self, env: simpy.Environment, steps: int):
        self.env = env
        self.counts = [0] * steps
        self.changed = env.event()

    def add(self, k: int, n: int) -> None:
        self.counts[k] += n
        ev, self.changed = self.changed, self.env.event()
        ev.succeed()


class Versions:
    def __init__(self, env: simpy.Environment):
        self.env, self.version, self.changed = env, 0, env.event()

    def publish(self, v: int) -> None:
        self.version = v
        ev, self.changed = self.changed, self.env.event()
        ev.succeed()

    def wait(self, v: int):
        while self.version < v:
            yield self.changed


SUPPORTED = ("relax", "verl", "openrlhf")


def check_supported(cfg: ExperimentConfig) -> None:
    if cfg.algorithm.advantage == "gae":
        raise ConfigError("algorithm.advantage: the simulator does not model the Critic (gae) yet")
    if cfg.algorithm.policy_loss == "opd":
        raise ConfigError("algorithm.policy_loss: the simulator does not model the teacher (opd) yet")
    if cfg.task.reward == "genrm":
        raise ConfigError("task.reward: the simulator does not model the GenRM service yet")
    if cfg.algorithm.dynamic_sampling.enabled:
        raise ConfigError("algorithm.dynamic_sampling: the simulator does not model DAPO redraws yet")


class Simulation:
    def __init__(self, cfg: ExperimentConfig, cost: CostModel, lengths: LengthModel, record: bool = True):
        check_supported(cfg)
        self.cfg, self.cost, self.lengths, self.record = cfg, cost, lengths, record
        self.env = simpy.Environment()
        self.steps, self.P, self.G = cfg.steps, cfg.rollout.prompts_per_step, cfg.rollout.group_size
        # Response lengths of every group of every partition, drawn once (the same for every schedule).
        self.resp = lengths.draw(cfg.seed, self.steps, self.P, self.G)
        self.prompt = lengths.prompt_tokens
        # Per group: response tokens, sequence tokens, sum of squared sequence lengths (attention), bus bytes.
        p = self.prompt
        self.g_resp = [[sum(g) for g in step] for step in self.resp]
        self.g_tok = [[len(g) * p + sum(g) for g in step] for step in self.resp]
        self.g_sq = [[sum((p + x) * (p + x) for x in g) for g in step] for step in self.resp]
        self.g_bytes = [[cost.rows_bytes(len(g), p, sum(g)) for g in step] for step in self.resp]
        self.order: list[list[int]] = [[] for _ in range(self.steps)]  # groups in the order they landed
        self.group_version = [[0] * self.P for _ in range(self.steps)]
        self.spans: list[Span] = []
        self.step_end: dict[int, float] = {}
        self.step_extra: dict[int, dict] = {}
        self.fields = {f: Ready(self.env, self.steps) for f in
                       ("generated", "rewards", "ref_log_probs", "old_log_probs", "advantages")}
        self.versions = Versions(self.env)
        self.gate = SimGate(self.env, cfg.max_staleness)
        self.has_ref = cfg.algorithm.kl_coef > 0
        self.has_fwd = cfg.algorithm.old_log_probs == "actor_fwd" and cfg.schedule == "relax"
        self.loaded = [0] * cfg.rollout.replicas  # weight version each replica holds
        self.next_group = [0] * self.steps  # the GroupQueue: next group of each partition never handed out
        self.chunk = cost.opt.inflight_groups or cfg.rollout.chunk_groups  # groups per engine call
        # rollout.max_inflight: request-level streaming that refills, as RolloutRole._run_streaming does it
        # (refill_replica; the colocate and emulated-baseline schedules: the claim's requests, at most max_inflight
        # at once, each group landing as its last sample ends); rollout.partial: a version that arrives mid-call is
        # loaded between decode steps (pause, load, go on).
        self.max_inflight = cfg.rollout.max_inflight
        self.stream = cost.opt.stream_groups or self.max_inflight is not None
        self.partial = cfg.rollout.partial
        self.notice = cost.notice_time()  # a waiting consumer's wake-up after rows land (Simulation.idle)
        hw = cost.hw
        self.cores = simpy.Container(self.env, capacity=int(hw.device.per_node.value),
                                     init=int(hw.device.per_node.value)) if hw.kind == "cpu" else None
        self.share = cost.core_share()  # of each core, what the session's background leaves the roles
        self.core_s = 0.0  # CPU profile: core-seconds the cores were held (roles' work and the bus's own CPU)
        # Bus calls priced: "call" (bus_time: a put + fetch's cost each), "empty_fetch" (an idle consumer's lookup
        # that found nothing, before it blocks: idle)
        self.bus_calls: Counter[str] = Counter()

    # --- helpers ------------------------------------------------------------------------------------------
    def busy(self, role: str, seconds: float):
        """`role` works for `seconds`. On a CPU profile the roles share the machine's cores (device.per_node):
        the work first takes the role's threads' worth of cores, first come first served, and holds them."""
        if self.cores is None:
            yield self.env.timeout(seconds)
            return
        n = min(getattr(self.cfg.resources, role).threads, self.cores.capacity)
        yield self.cores.get(n)
        yield self.env.timeout(seconds * self.stretch(n))
        self.core_s += n * seconds * self.stretch(n)
        yield self.cores.put(n)

    def bus_time(self, rows: int, nbytes: float, calls: int = 1, kind: str = "call") -> float:
        """The caller's seconds for `calls` bus calls of these rows. On a CPU profile the bus's other processes
        burn CPU besides (cost.bus_parallel_cpu): that takes a core of its own meanwhile, the caller not waiting
        (from when the caller's piece of work that makes the call starts: the model does not place the call inside
        it)."""
        self.bus_calls[kind] += calls
        if self.cores is not None and (cpu := calls * self.cost.bus_parallel_cpu(rows)) > 0:
            self.env.process(self._bus_cpu(cpu))
        return calls * self.cost.bus_time(rows, nbytes)

    def _bus_cpu(self, seconds: float):
        yield self.cores.get(1)
        yield self.env.timeout(seconds * self.stretch(1))
        self.core_s += seconds * self.stretch(1)
        yield self.cores.put(1)

    def stretch(self, n: int) -> float:
        """How much longer work holding n of a CPU profile's cores takes for the session's background (Ray, the bus,
        DCS heartbeats: cost.core_share). Work on every core is not stretched: `relax profile --ray` timed it beside
        that background already (relax.sim.measure.idle_session), threads on every core stalling at its wake-ups."""
        return 1.0 if n >= self.cores.capacity else 1.0 / self.share

    def idle(self, ev: simpy.Event):
        """Wait for `ev` as the engine's consumers wait (relax.bus.Bus.fetch `wait`): a lookup that finds nothing
        (a bus call without rows: the caller waits for it, the bus's processes burn their CPU), then blocked in the
        bus coordinator, using no core, until the producer's notice arrives -- one control RPC after the rows land.
        (The engine's first idle on a partition looks twice; later ones once.)"""
        yield self.env.timeout(self.bus_time(0, 0.0, kind="empty_fetch"))
        yield ev
        yield self.env.timeout(self.notice)

    def span(self, role, name, step, start, **args) -> None:
        if self.record and self.env.now > start:
            self.spans.append(Span(role, name, step, start, self.env.now, args))

    def tokens(self, k: int, groups) -> tuple[float, float]:
        """(sequence tokens, sum of squared sequence lengths) of these groups of partition k."""
        tok, sq = self.g_tok[k], self.g_sq[k]
        return sum(tok[g] for g in groups), sum(sq[g] for g in groups)

    def seqs(self, k: int, groups) -> list[float]:
        """Sequence lengths (prompt + response) of these groups' rows of partition k, in row order."""
        return [self.prompt + x for g in groups for x in self.resp[k][g]]

    def forward_time(self, k: int, groups, role: str, padded: bool = True) -> float:
        """`role`'s log-prob forward over these groups of partition k (their media through the towers too), cut
        and padded as the engine's forwards do (padded=False: the sequences' own work, for the bound)."""
        work = padded_work(self.seqs(k, groups), self.cfg.training.micro_batch_tokens) if padded else None
        return self.cost.forward_time(*self.tokens(k, groups), role, rows=len(groups) * self.G, padded=work)

    def rows_bytes(self, k: int, groups) -> tuple[int, float]:
        b = self.g_bytes[k]
        return len(groups) * self.G, sum(b[g] for g in groups)

    def claim(self, upto: int, most: int | None = None) -> tuple[int, list[int]] | None:
        """The GroupQueue: up to chunk groups (or `most`, if fewer) of the lowest partition <= upto left."""
        for j in range(upto + 1):
            lo = self.next_group[j]
            if lo < self.P:
                hi = min(self.P, lo + min(self.chunk, most or self.chunk))
                self.next_group[j] = hi
                return j, list(range(lo, hi))
        return None

    def generate_chunk(self, r: int, k: int, groups: list[int]):
        """One engine call on replica r, then the put of its rows."""
        t0 = self.env.now
        dur, fin = self.cost.generate([(self.prompt, x) for g in groups for x in self.resp[k][g]], self.max_inflight)
        if self.stream:
            n = min(self.cfg.resources.rollout.threads, self.cores.capacity) if self.cores is not None else 0
            if n:  # a CPU profile: the call holds the rollout's cores throughout, as busy() does
                yield self.cores.get(n)
                dur, fin = dur * self.stretch(n), [f * self.stretch(n) for f in fin]
            t1 = self.env.now
            yield from self.stream_chunk(r, k, groups, t0, dur, fin)
            if n:
                self.core_s += n * (self.env.now - t1)
                yield self.cores.put(n)
            return
        rows, nbytes = self.rows_bytes(k, groups)
        yield from self.busy("rollout", dur + self.bus_time(rows, nbytes))
        for g in groups:
            self.group_version[k][g] = self.loaded[r]
        self.order[k].extend(groups)
        self.span("rollout", "generate", k, t0, groups=len(groups), replica=r)
        self.fields["generated"].add(k, len(groups))

    def stream_chunk(self, r: int, k: int, groups: list[int], t0: float, dur: float, fin: list[float]):
        """SimOptions.stream_groups: each group's rows are put when its last response finishes (its own bus
        time after that), while the engine goes on with the rest of the call."""
        G, ends = self.G, []
        for i, g in enumerate(groups):
            ends.append((max(fin[i * G:(i + 1) * G]), g))
        first = self.loaded[r]  # the version the call started with: the one the staleness bound applies to
        paused = 0.0  # partial rollout: seconds this call stood still loading versions that arrived during it
        for end, g in sorted(ends):
            put = self.bus_time(*self.rows_bytes(k, [g]))
            while (wait := t0 + paused + end + put - self.env.now) > 0:
                paused += yield from self.wait_or_load(r, k, wait)
            self.group_version[k][g] = first
            self.order[k].append(g)
            self.fields["generated"].add(k, 1)
        while (wait := t0 + paused + dur - self.env.now) > 0:
            paused += yield from self.wait_or_load(r, k, wait)
        self.span("rollout", "generate", k, t0, groups=len(groups), replica=r)

    def wait_or_load(self, r: int, k: int, seconds: float):
        """Generate on for `seconds`; under partial rollout a version arriving first is loaded between decode
        steps, and the call stands still for its load. Returns the seconds it stood still."""
        if not self.partial:
            yield self.env.timeout(seconds)
            return 0.0
        yield self.env.timeout(seconds) | self.versions.changed
        if self.versions.version <= self.loaded[r]:
            return 0.0
        t0 = self.env.now
        yield self.env.timeout(self.cost.weight_load_time())  # the call's cores are already held
        self.loaded[r] = self.versions.version
        extra = self.step_extra.setdefault(k, {})
        extra["weight_load_s"] = extra.get("weight_load_s", 0.0) + self.env.now - t0
        self.span("rollout", "weight_sync", k, t0, replica=r, partial=True)
        return self.env.now - t0

    def load_weights(self, r: int, step: int, min_version: int | None = None):
        """Replica r loads the newest version (waiting for `min_version` first when given)."""
        t0 = self.env.now
        if min_version is not None:
            yield from self.versions.wait(min_version)
        if self.versions.version > self.loaded[r]:
            t1 = self.env.now
            yield from self.busy("rollout", self.cost.weight_load_time())
            self.loaded[r] = self.versions.version
            self.step_extra.setdefault(step, {}).setdefault("weight_load_s", 0.0)
            self.step_extra[step]["weight_load_s"] += self.env.now - t1
        self.span("rollout", "weight_sync", step, t0, replica=r)

    def generate_partition(self, k: int):
        """Every replica takes chunks of partition k until none is left (the whole-batch schedules)."""
        def worker(r):
            while True:
                c = self.claim(k)
                if c is None or c[0] != k:
                    if c is not None:  # never happens: lower partitions are done before k starts
                        raise RuntimeError("claimed another partition")
                    return
                yield from self.generate_chunk(r, *c)
        yield self.env.all_of([self.env.process(worker(r)) for r in range(self.cfg.rollout.replicas)])

    def wait_fields(self, k: int, names: list[str], need: int):
        """Until every field in `names` has >= need groups of partition k ready."""
        while min(self.fields[f].counts[k] for f in names) < need:
            yield from self.idle(self.wait_more(k, names))

    def wait_more(self, k: int, names: list[str]) -> simpy.Event:
        """The next change of the field of `names` with the fewest groups of partition k ready: what all of them
        have ready cannot grow before it does (cheaper than a SimPy condition over every field)."""
        return self.fields[min(names, key=lambda f: self.fields[f].counts[k])].changed

    # --- streaming services (relax; reward and advantages in every async schedule) -------------------------
    def service(self, role: str, name: str, inputs: list[str], output: str, work):
        fields = [self.fields[f] for f in inputs]
        for k in range(self.steps):
            done = 0
            while done < self.P:
                avail = (fields[0].counts[k] if len(fields) == 1 else min(f.counts[k] for f in fields)) - done
                if avail <= 0:
                    yield from self.idle(self.wait_more(k, inputs))
                    continue
                groups = self.order[k][done:done + avail]
                t0 = self.env.now
                rows, nbytes = self.rows_bytes(k, groups)
                yield from self.busy(role, work(k, groups) + self.bus_time(rows, nbytes))
                self.span(role, name, k, t0, rows=rows)
                done += avail
                self.fields[output].add(k, avail)

    def _reward(self, k, groups):
        return self.cost.reward_time(len(groups) * self.G)

    def _advantages(self, k, groups):
        return self.cost.advantages_time(len(groups) * self.G)

    def _ref(self, k, groups):
        return self.forward_time(k, groups, "reference")

    def _fwd(self, k, groups):
        return self.forward_time(k, groups, "actor_fwd")

    def start_services(self, reference: bool = True) -> None:
        env = self.env
        env.process(self.service("reward", "reward", ["generated"], "rewards", self._reward))
        env.process(self.service("advantages", "advantages", ["rewards"], "advantages", self._advantages))
        if self.has_ref and reference:
            env.process(self.service("reference", "ref_log_probs", ["generated"], "ref_log_probs", self._ref))
        if self.has_fwd:
            env.process(self.service("actor_fwd", "old_log_probs", ["generated"], "old_log_probs", self._fwd))

    # --- the trainer ----------------------------------------------------------------------------------------
    def micro_batches(self, k: int, groups: list[int]) -> list[list[int]]:
        budget = self.cost.micro_batch_tokens()
        out, cur, tokens = [], [], 0.0
        for g in groups:
            t = self.g_tok[k][g]
            if cur and tokens + t > budget:
                out.append(cur)
                cur, tokens = [], 0.0
            cur.append(g)
            tokens += t
        return out + ([cur] if cur else [])

    def expected_micro_batches(self, k: int) -> float:
        return max(len(self.micro_batches(k, list(range(self.P)))) / self.cost.data_parallel(), 1.0)

    def train_micro_batch(self, k: int, groups: list[int], m: float):
        """One micro-batch's forward + backward; its rows were fetched before (`fetch`)."""
        t0 = self.env.now
        rows = len(groups) * self.G
        work = padded_work(self.seqs(k, groups))  # the trainer pads a micro-batch to its longest row
        yield from self.busy("actor", self.cost.train_time(*self.tokens(k, groups), m, rows=rows, padded=work))
        self.span("actor", "train_micro_batch", k, t0, rows=rows)

    def fetch(self, role: str, k: int, groups: list[int]):
        """One bus fetch of these groups' rows by `role` (a call, its rows, its bytes)."""
        yield from self.busy(role, self.bus_time(*self.rows_bytes(k, groups)))

    def finish_step(self, k: int, publish: bool = True):
        t0 = self.env.now
        yield from self.busy("actor", self.cost.optimizer_time())
        self.span("actor", "optimizer_step", k, t0)
        if publish:
            t1 = self.env.now
            yield from self.busy("actor", self.cost.publish_time())
            self.span("actor", "weight_publish", k, t1)
            self.step_extra.setdefault(k, {})["weight_sync_s"] = self.env.now - t1
        self.versions.publish(k + 1)

    def end_step(self, k: int, t_start: float, wait_s: float):
        """Step k is trained (the gate learns it), then the Actor writes its periodic checkpoint, as
        ActorRole.train_partition does after the publish."""
        self.gate.mark_trained(k)
        if checkpoint_due(self.cfg.health.checkpoint_every, k) and (ck := self.cost.checkpoint_time()) > 0:
            t0 = self.env.now
            yield from self.busy("actor", ck)
            self.span("actor", "checkpoint", k, t0)
        self.step_end[k] = self.env.now
        e = self.step_extra.setdefault(k, {})
        e["trainer_wait_s"] = e.get("trainer_wait_s", 0.0) + wait_s
        e["train_time_s"] = self.env.now - t_start

    def actor_inputs(self) -> list[str]:
        return ["advantages"] + ["ref_log_probs"] * self.has_ref + ["old_log_probs"] * self.has_fwd

    def actor_streaming(self):
        inputs = self.actor_inputs()
        for k in range(self.steps):
            t_start, wait, fetched, done, pending_tokens = self.env.now, 0.0, 0, 0, 0.0
            m = self.expected_micro_batches(k)
            budget = self.cost.micro_batch_tokens()
            tok, order = self.g_tok[k], self.order[k]
            while done < self.P:
                # StreamingLoader: while the fetched groups cannot fill a micro-batch, one fetch of every group
                # ready; then the first fetched group, and more while they fit the token budget.
                if fetched < self.P and pending_tokens < budget:
                    avail = min(self.fields[f].counts[k] for f in inputs) - fetched
                    if avail > 0:
                        yield from self.fetch("actor", k, order[fetched:fetched + avail])
                        pending_tokens += sum(tok[g] for g in order[fetched:fetched + avail])
                        fetched += avail
                        continue
                    if fetched == done:
                        t0 = self.env.now
                        yield from self.idle(self.wait_more(k, inputs))
                        wait += self.env.now - t0
                        continue
                take, tokens = [], 0.0
                for g in order[done:fetched]:
                    t = tok[g]
                    if take and tokens + t > budget:
                        break
                    take.append(g)
                    tokens += t
                yield from self.train_micro_batch(k, take, m)
                done += len(take)
                pending_tokens -= tokens
            yield from self.finish_step(k)
            yield from self.end_step(k, t_start, wait)

    # --- relax async ----------------------------------------------------------------------------------------
    def enter(self, r: int, k: int):
        """Replica r enters partition k: the staleness gate, then weights >= k - max_staleness."""
        t0 = self.env.now
        yield self.gate.wait_can_start(k)
        self.span("rollout", "staleness_gate", k, t0, replica=r)
        yield from self.load_weights(r, k, min_version=k - self.cfg.max_staleness)

    def rollout_replica(self, r: int):
        if self.max_inflight is not None:
            yield from self.refill_replica(r)
            return
        shared = self.cfg.rollout.replicas > 1
        k = 0
        yield from self.enter(r, k)
        while True:
            c = self.claim(k)
            if c is None:
                if k + 1 >= self.steps:
                    return
                k += 1
                yield from self.enter(r, k)
                continue
            if shared and self.versions.version > self.loaded[r]:  # sync_weights(block=False) between chunks
                yield from self.load_weights(r, c[0])
            yield from self.generate_chunk(r, *c)

    def refill_replica(self, r: int):
        """rollout.max_inflight: RolloutRole._run_streaming with its feed (relax/roles/stream.py). One engine
        (relax/sim/live.py) kept full: a free slot takes the next request of the claims held, claiming more from
        partition k, or k + 1 once the gate admits it and the loaded version may start it. Without partial
        rollout no work is taken once a newer version is out: the engine drains and loads it. A group lands
        (after its put) when its last sample finishes; its version is the one loaded when its first joined."""
        s, G = self.cfg.max_staleness, self.G
        eng = LiveEngine(self.cost, self.max_inflight)
        queued: deque = deque()  # (k, g, sample) claimed, not yet in the engine
        left, claim_of, claims = {}, {}, {}  # (k, g) -> samples left; (k, g) -> claim id; id -> [start, open groups]
        k, held = 0, 0  # held: cores the engine holds (a CPU profile)
        yield from self.enter(r, k)
        while True:
            gated = False
            while eng.free():
                if not queued:
                    if not self.partial and self.versions.version > self.loaded[r]:
                        break
                    most = -(-eng.free() // G)  # only what the free slots start (relax/roles/stream.py)
                    c = self.claim(k, most)
                    while (c is None and k + 1 < self.steps and self.gate.admits(k + 1)
                           and self.loaded[r] >= k + 1 - s):  # enter k + 1 mid-stream
                        k += 1
                        c = self.claim(k, most)
                    if c is None:
                        gated = k + 1 < self.steps
                        break
                    cid = len(claims)
                    claims[cid] = [self.env.now, len(c[1])]
                    for g in c[1]:
                        left[(c[0], g)], claim_of[(c[0], g)] = G, cid
                        queued.extend((c[0], g, x) for x in range(G))
                j, g, x = queued.popleft()
                if left[(j, g)] == G and x == 0:
                    self.group_version[j][g] = self.loaded[r]  # a group's oldest row: its first sample's join
                eng.add((j, g), self.prompt, self.resp[j][g][x])
            if not len(eng):
                if held:
                    self.core_s += held * (self.env.now - held_t0)
                    yield self.cores.put(held)
                    held = 0
                if gated:
                    k += 1
                    yield from self.enter(r, k)
                elif not self.partial and self.versions.version > self.loaded[r]:
                    yield from self.load_weights(r, k)  # drained for it
                else:
                    return
                continue
            if self.cores is not None and not held:  # a CPU profile: the stream holds the rollout's cores
                held = min(self.cfg.resources.rollout.threads, self.cores.capacity)
                yield self.cores.get(held)
                held_t0 = self.env.now
            t0 = eng.t
            done = eng.advance()
            todo = (eng.t - t0) * (self.stretch(held) if held else 1.0)
            while todo > 1e-12:  # partial rollout: a version arriving meanwhile is loaded (the engine stands still)
                t1 = self.env.now
                paused = yield from self.wait_or_load(r, k, todo)
                todo -= self.env.now - t1 - paused
            for j, g in done:
                left[(j, g)] -= 1
                if left[(j, g)] == 0:
                    cid = claim_of.pop((j, g))
                    claims[cid][1] -= 1
                    self.env.process(self.land(r, j, g, claims[cid] if claims[cid][1] == 0 else None))

    def land(self, r: int, k: int, g: int, claim: list | None):
        """Group g of partition k is put on the bus (its rows' bus time after its last sample finished)."""
        yield self.env.timeout(self.bus_time(*self.rows_bytes(k, [g])))
        self.order[k].append(g)
        self.fields["generated"].add(k, 1)
        if claim is not None:  # the claim's last group: its generate span, as the Rollout records it
            self.span("rollout", "generate", k, claim[0], replica=r)

    def run_async(self) -> None:
        for r in range(self.cfg.rollout.replicas):
            self.env.process(self.rollout_replica(r))
        self.start_services()
        self.env.process(self.actor_streaming())

    # --- relax colocate -------------------------------------------------------------------------------------
    def colocate(self):
        for k in range(self.steps):
            t_start = self.env.now
            if k > 0:
                t0 = self.env.now
                yield from self.busy("rollout", self.cost.wake_time())
                self.loaded = [self.versions.version] * len(self.loaded)
                self.span("rollout", "wake", k, t0)
                self.step_extra.setdefault(k, {})["sleep_wake_s"] = self.env.now - t0
            yield from self.generate_partition(k)
            t0 = self.env.now
            yield from self.busy("rollout", self.cost.sleep_time())
            self.span("rollout", "sleep", k, t0)
            e = self.step_extra.setdefault(k, {})
            e["sleep_wake_s"] = e.get("sleep_wake_s", 0.0) + self.env.now - t0
            groups = self.order[k]
            rows, nbytes = self.rows_bytes(k, groups)
            stages = [("reward", "reward", self._reward)]
            if self.has_ref:
                stages.append(("reference", "ref_log_probs", self._ref))
            stages.append(("advantages", "advantages", self._advantages))
            for role, name, work in stages:
                t0 = self.env.now
                yield from self.busy(role, work(k, groups) + self.bus_time(rows, nbytes) + self.cost.rpc)
                self.span(role, name, k, t0, rows=rows)
            yield from self.fetch("actor", k, groups)
            m = self.expected_micro_batches(k)
            for mb in self.micro_batches(k, groups):
                yield from self.train_micro_batch(k, mb, m)
            yield from self.finish_step(k)
            yield from self.end_step(k, t_start, 0.0)

    # --- veRL one-step-off-policy (relax/schedules/verl.py) -------------------------------------------------
    def verl_trainer(self):
        gen = {0: self.env.process(self.generate_partition(0))}
        for k in range(self.steps):
            t_start = t0 = self.env.now
            yield gen.pop(k)
            yield from self.wait_fields(k, ["advantages"], self.P)
            groups = self.order[k]
            rows = len(groups) * self.G
            yield from self.fetch("actor", k, groups)
            self.span("actor", "rollout_residual", k, t0)
            t1 = self.env.now
            yield self.env.process(self._all_load(k + 1))  # every engine loads the weights: a barrier
            self.span("actor", "weight_sync_barrier", k, t1)
            wait = self.env.now - t_start
            if k + 1 < self.steps:
                gen[k + 1] = self.env.process(self.generate_partition(k + 1))
            t2 = self.env.now
            yield from self.busy("actor", self.forward_time(k, groups, "actor"))
            self.span("actor", "old_logprob", k, t2, rows=rows)
            if self.has_ref:
                t3 = self.env.now
                yield from self.busy("actor", self.forward_time(k, groups, "actor"))
                self.span("actor", "ref_forward", k, t3, rows=rows)
            m = self.expected_micro_batches(k)
            for mb in self.micro_batches(k, groups):
                yield from self.train_micro_batch(k, mb, m)
            yield from self.finish_step(k)
            yield from self.end_step(k, t_start, wait)

    def _all_load(self, step: int):
        yield self.env.all_of([self.env.process(self.load_weights(r, step))
                               for r in range(self.cfg.rollout.replicas)])

    def run_verl(self) -> None:
        self.start_services(reference=False)
        self.env.process(self.verl_trainer())

    # --- OpenRLHF async (relax/schedules/openrlhf.py) ------------------------------------------------------
    def run_openrlhf(self) -> None:
        slots = simpy.Container(self.env, capacity=self.cfg.max_staleness, init=self.cfg.max_staleness)
        lock = simpy.Resource(self.env, capacity=1)
        self.start_services(reference=False)
        self.env.process(self.openrlhf_generator(slots, lock))
        self.env.process(self.openrlhf_trainer(slots, lock))

    def openrlhf_generator(self, slots, lock):
        for k in range(self.steps):
            t0 = self.env.now
            yield slots.get(1)
            self.span("rollout", "queue_slot_wait", k, t0)
            t1 = self.env.now
            req = lock.request()
            yield req
            self.span("rollout", "generation_lock_wait", k, t1)
            yield self.env.process(self._all_load(k))  # generate_partition loads the newest weights first
            yield from self.generate_partition(k)
            lock.release(req)

    def openrlhf_trainer(self, slots, lock):
        for k in range(self.steps):
            t_start = t0 = self.env.now
            yield from self.wait_fields(k, ["advantages"], self.P)
            groups = self.order[k]
            rows = len(groups) * self.G
            yield from self.fetch("actor", k, groups)
            self.span("actor", "trainer_wait", k, t0)
            queue_wait = self.env.now - t0
            yield slots.put(1)
            ref = None
            if self.has_ref:
                ref = self.env.process(self._ref_call(k, groups))
            t1 = self.env.now
            yield from self.busy("actor", self.forward_time(k, groups, "actor"))
            self.span("actor", "old_logprob", k, t1, rows=rows)
            if ref is not None:
                t2 = self.env.now
                yield ref
                self.span("actor", "ref_forward_wait", k, t2)
            m = self.expected_micro_batches(k)
            for mb in self.micro_batches(k, groups):
                yield from self.train_micro_batch(k, mb, m)
            t3 = self.env.now
            yield from self.busy("actor", self.cost.optimizer_time())
            self.span("actor", "optimizer_step", k, t3)
            t4 = self.env.now
            req = lock.request()
            yield req  # the broadcast waits for the in-flight generation
            self.span("actor", "broadcast_lock_wait", k, t4)
            lock_wait = self.env.now - t4
            t5 = self.env.now
            yield from self.busy("actor", self.cost.publish_time())
            self.span("actor", "weight_publish", k, t5)
            lock.release(req)
            self.step_extra.setdefault(k, {})["weight_sync_s"] = self.env.now - t5
            self.versions.publish(k + 1)
            yield from self.end_step(k, t_start, queue_wait + lock_wait)

    def _ref_call(self, k, groups):
        t0 = self.env.now
        rows, nbytes = self.rows_bytes(k, groups)
        yield from self.busy("reference", self._ref(k, groups) + self.bus_time(rows, nbytes, calls=2) + self.cost.rpc)
        self.span("reference", "ref_log_probs", k, t0, rows=rows)

    # --- run ------------------------------------------------------------------------------------------------
    def run(self) -> "Simulation":
        cfg = self.cfg
        if cfg.mode == "colocate":
            self.env.process(self.colocate())
        elif cfg.schedule == "verl":
            self.run_verl()
        elif cfg.schedule == "openrlhf":
            self.run_openrlhf()
        else:
            self.run_async()
        self.env.run()
        if len(self.step_end) != self.steps:
            raise RuntimeError(f"simulation stalled after {len(self.step_end)} of {self.steps} steps")
        return self
