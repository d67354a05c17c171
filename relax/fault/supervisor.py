"""The supervisor: starts the services, watches them, injects faults, and brings failed ones back.

Health. Every role process heartbeats to the DCS coordinator from a background thread, and the supervisor
waits on every role's `run()` call, so a process that dies is seen at once (its call fails with
ActorDiedError); one that stops heartbeating for `health.heartbeat_timeout_s` is killed and handled the same.

Tier 1, in-place restart of a stateless role (Reward, Reference, Advantages, a Rollout replica): a new actor
is created in place (Reference and Rollout pull their weights from a live DCS peer in their constructor),
it resumes at the oldest partition not yet trained, and the bus hands it its unfinished work again: its task's
consumption is reset on the live partitions (TQ has no ack: rows it fetched but never wrote would be lost)
and it skips rows that already carry its output. A Rollout replica's open claims go back to the GroupQueue
(a claim cut by the kill is generated again; groups that did land are not).

Tier 2, global restart (the Actor failed, or one role failed more than `health.max_role_restarts` times),
at most `max_global_restart` times: every role process is stopped and started again; training resumes from
the newest version a live process holds (the driver follows every version, so this is the last committed
one; versions that died with the Actor roll back with their samples in the DCS ledger), the optimizer
state comes from the Actor's periodic checkpoint, and every partition still on the bus is handed out again
(rows already carrying a role's output are skipped). The bus itself survives.

Every dead process gets exactly one recovery event naming its pid (and the injected fault that killed it, if
one did): processes found dead beside the Actor, or found dead while a global restart stops the world, are
recorded as superseded by it, so five kills at once give five events; the global restart's event lists the
processes it stopped itself (`stopped_pids`).

The exactly-once account is the DCS ledger: sample ids of committed versions. `recovery.json` in the run
folder records every fault and recovery (times to detect and to be ready, DCS vs disk reload).
"""

from __future__ import annotations

import logging
import signal
import time
from collections import Counter
from pathlib import Path

import ray

from relax.api.pool import GroupQueue, RayRolloutPool
from relax.config import runs_megatron
from relax.fault.checkpoint import WEIGHTS
from relax.fault.heartbeat import exited, missed_heartbeats, wait_exited
from relax.fault.inject import FaultInjector
from relax.fault.redelivery import live_partitions, redeliver, waiting
from relax.fault.stall import stall_limit
from relax.placement import Placement
from relax.roles.registry import ROLES, role_class, task_of
from relax.run_folder import CHECKPOINTS, RunFolder
from relax.schedules.context import RunContext
from relax.weights import DCS

log = logging.getLogger(__name__)
MID_PUT_WAIT_S = 0.1  # a due mid_put kill waits this long a tick for its replica to be held mid-put (wait_held)
MID_PUT_RELEASE_S = 1.0  # ... and holds the Actor while its replica has had an open claim within this long (_released)


class Supervisor:
    """Starts, watches and restarts the roles of one run. It sees the run only through `ctx`
    (relax.schedules.context.RunContext): the config, run folder, bus, telemetry, role names and live
    handles, the step records and the poll hook."""

    def __init__(self, ctx: RunContext, api_port: int | None = None):
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.api_port = api_port
        self.api = None
        self.events: list[dict] = []
        self.dead_pids: set[int] = set()  # processes whose death has its recovery event
        self.restarts: Counter = Counter()
        self.global_restarts = 0
        self.generation: Counter = Counter()
        self.ckpt_dir = Path(ctx.run_dir) / CHECKPOINTS
        self.futs: dict = {}
        self.restarting: dict = {}  # ready() ref of a replacement -> (role key, handle, event)
        self.pids: dict[str, int] = {}
        self.backends: dict[str, str] = {}
        # GPU placement groups (relax/placement.py): one per Megatron role with GPUs in async mode, one shared by
        # every GPU role in colocate mode; made on first use and kept across restarts.
        self.placement = Placement(self.cfg)
        self.injector = FaultInjector(self.cfg.faults, self._pid_for)
        self.released: set[int] = set()  # faults that no longer hold the Actor though not fired (_released)
        self.claimless_since: dict[int, float] = {}
        self.t_start = time.time()

    # ---- set-up ---------------------------------------------------------------------------------------------
    @staticmethod
    def start_dcs(cfg) -> DCS:
        """The run's DCS (`cfg.dcs`), returned while its coordinator's process may still be starting (the first call
        on it waits): the controller starts it before the bus, so the two start-ups overlap."""
        d = cfg.dcs
        return DCS.start(d.transport, d.bucket_mb, d.timeout_s, cfg.health.heartbeat_s, d.device, d.reuse_groups,
                         wait=False)

    def start(self, initial_state: dict, dcs: DCS) -> None:
        """Version 0 in `dcs` (from `start_dcs`), the roles and rollout replicas, faults, recovery and the API."""
        cfg, ctx = self.cfg, self.ctx
        self.dcs = dcs
        # The driver pins version 0 (the reference policy) and follows every newer version.
        self.dcs.join("driver", serve=True, follow=True, durable=True)
        self.dcs.publish(0, initial_state, pin=True)
        shared = cfg.mode == "async" and cfg.schedule == "relax"
        self.queue = GroupQueue.remote(cfg.steps, cfg.rollout.prompts_per_step, cfg.rollout.chunk_groups) if shared else None
        res = cfg.resources.rollout
        self.pool = RayRolloutPool(lambda i: self._create("rollout", i), self._start_replica, self.queue, self.dcs,
                                   need={"CPU": res.cpus, "GPU": res.gpus})
        for name in ctx.role_names:
            if name != "rollout":
                ctx.roles[name] = self._create(name)
        replicas = self.pool.add_initial(cfg.rollout.replicas)
        ctx.roles["rollout"] = replicas[0].handle
        spares = [self.pool.add_spare() for _ in range(cfg.health.spare_rollout if self.queue is not None else 0)]
        # The roles' processes start while TQ's do (Bus.start(wait=False)); none touches TQ before its run.
        ctx.bus.wait_started()
        ray.get([r.ready.remote() for r in [*ctx.roles.values(), *(s.handle for s in spares)]])
        for s in spares:
            s.pid, s.status = ray.get(s.handle.pid.remote()), "SPARE"
        self.pids = {n: ray.get(h.pid.remote()) for n, h in ctx.roles.items() if n != "rollout"}
        self.backends = {n: ray.get(h.backend.remote()) for n, h in ctx.roles.items()}  # summary.json
        if self.api_port is not None:
            self._start_api()

    def _start_api(self) -> None:
        from relax.api.scaling import ScaleManager
        from relax.api.server import start_api

        self.scaler = ScaleManager(self.pool, max_replicas=self.cfg.rollout.max_replicas)
        self.api = start_api(self.ctx.run_dir, self.scaler, self.api_port, metrics=self.metrics,
                             health=lambda: {"steps_done": len(self.ctx.records), "steps": self.cfg.steps},
                             stop=self.request_stop)
        log.warning("control API on %s (token in %s)", self.api.url, Path(self.ctx.run_dir) / "api_token")

    def request_stop(self) -> dict:
        """POST /run/stop (the API's thread): the schedule's loop ends the run at its next poll; asking twice
        keeps the first request."""
        ctx = self.ctx
        if ctx.stop_reason is None:
            ctx.stop_reason = f"stopped over the control API after {len(ctx.records)} of {self.cfg.steps} steps"
        return {"status": "stopping", "reason": ctx.stop_reason, "steps_done": len(ctx.records),
                "steps": self.cfg.steps}

    def _create(self, name: str, index: int | None = None, resume: bool = False):
        cfg, ctx = self.cfg, self.ctx
        key = name if index is None else f"{name}-{index}"
        self.generation[key] += 1
        gen = self.generation[key]
        res = getattr(cfg.resources, name)
        kwargs: dict = {}
        if name == "rollout":
            kwargs = {"replica": index, "queue": self.queue}
        elif name == "actor":
            kwargs = {"ckpt_dir": str(self.ckpt_dir), "resume": resume}
        actor_name = f"relax-{key}" + (f"-restart{gen - 1}" if gen > 1 else "")
        opts = {"num_cpus": res.cpus, "name": actor_name}
        if res.gpus > 0 and runs_megatron(cfg, name):
            # Megatron on GPUs (Actor, Reference): the role is rank 0 of its group, on bundle 0 of its placement
            # group (the role's own in async mode, a whole GPU per rank; in colocate mode the group every GPU role
            # shares, a fraction of each GPU per rank). Made once: a restarted role's ranks take the freed bundles.
            opts.update(self.placement.options(name, 0))
        elif name == "rollout" and cfg.rollout.engine == "sglang" and not cfg.rollout.engine_urls and res.gpus > 0:
            # The replica launches its SGLang server as a child process: it holds engine `index`'s bundle (its TP's
            # GPUs; Ray sets CUDA_VISIBLE_DEVICES, which the server inherits).
            opts.update(self.placement.options(name, index or 0))
        return ROLES[name].options(**opts).remote(cfg, ctx.bus, ctx.telemetry, self.dcs, res.threads, **kwargs)

    def _start_replica(self, handle, index: int, start: int | None = None, recover: bool = False):
        """A replica's run loop, from the oldest partition not yet trained (a replica added mid-run too)."""
        if start is None:
            start = self.ctx.bus.oldest_unconsumed()
        return handle.run.remote(self.cfg.steps, start=start, recover=recover)

    def _pid_for(self, spec) -> int | None:
        """The process a due fault hits now, or None (not now: it is restarting, or its trigger's state is not
        reached: FaultSpec.mid_put)."""
        if spec.role == "rollout":
            rep = self.pool.replicas.get(spec.replica)
            if rep is None or rep.status != "ACTIVE":
                return None
            if spec.mid_put and not ray.get(self.queue.wait_held.remote(spec.replica, MID_PUT_WAIT_S)):
                return None
            return rep.pid
        return self.pids.get(spec.role)

    # ---- the async schedule with supervision ------------------------------------------------------------------
    def _watched(self) -> dict:
        return {**self.futs, **{f: ("rollout", i) for f, i in self.pool.futures().items()}}

    def run(self, bar) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.t_start = time.time()
        self.futs = {ctx.roles[n].run.remote(cfg.steps): n for n in ctx.role_names if n != "rollout"}
        self.pool.activate_all()
        last_health = last_poll = last_step_t = time.time()
        progress = (0, 0)
        actor_done = False
        while not actor_done:
            watch = self._watched()
            pending = [*watch, *self.restarting]
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            failed = []
            for ref in done:
                if ref in self.restarting:
                    self._finish_restart(ref)
                    continue
                key = watch[ref]
                if self._settle(ref, key):
                    actor_done |= key == "actor"
                else:
                    failed.append(key)
            if failed:
                self._recover(failed)
            if self.injector.pending:
                self._inject()
            if time.time() - last_health > 0.5:
                self._check_heartbeats()
                last_health = time.time()
            if time.time() - last_poll > 0.3:  # step records (fault triggers), progress bar, memory
                ctx.poll(bar)
                last_poll = time.time()
                # A step, a recovery event or a restart under way is progress.
                if (len(ctx.records), len(self.events)) != progress or self.restarting:
                    progress, last_step_t = (len(ctx.records), len(self.events)), last_poll
                elif last_poll - last_step_t > stall_limit(cfg.health.stall_timeout_s, ctx.records):
                    self._stalled(last_poll - last_step_t)
                ctx.obey_stop()
        self.injector.stop()
        # Every partition is trained: the other loops end on their own.
        for ref, key in self._watched().items():
            try:
                ray.get(ref, timeout=120)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                log.warning("%s did not end cleanly after training finished", key)
            if isinstance(key, tuple):
                self.pool.finished(key[1])

    def _stalled(self, seconds: float) -> None:
        """No step for `seconds`: write the stall report (relax/fault/stall.py) and fail the run."""
        from relax.fault import stall

        ctx = self.ctx
        pids = dict(self.pids)
        pids |= {f"rollout-{i}": r.pid for i, r in self.pool.snapshot().items() if r.pid is not None}
        sections = {
            "progress": f"{len(ctx.records)} of {self.cfg.steps} steps; none for {seconds:.0f} s "
                        f"(limit {stall.stall_limit(self.cfg.health.stall_timeout_s, ctx.records):g} s); recovery events: {self.events}",
            "staleness gate": f"oldest unconsumed {ctx.bus.oldest_unconsumed()}, rows held {ctx.bus.held_rows()}",
            "group queue": str(ray.get(self.queue.stats.remote())) if self.queue is not None else "none",
            "actor step (telemetry)": str(ray.get(ctx.telemetry.fault_state.remote())),
            "bus": stall.bus_state(ctx.bus, self.cfg, ctx.role_names),
        }
        if len(ray.nodes()) == 1:
            sections |= {f"py-spy {n} (pid {p})": stall.py_spy(p) for n, p in pids.items()}
        path = stall.write_report(ctx.run_dir, sections)
        raise RuntimeError(f"the run stalled: no step finished for {seconds:.0f} s; where every role waits: {path}")

    def _inject(self) -> None:
        """Fire the faults due at the step the Actor is on (its own counter, from Telemetry) and tell it which
        fired: the Actor waits for them before its next step (ActorRole.await_faults)."""
        step, _ = ray.get(self.ctx.telemetry.fault_state.remote())
        fired = [f["index"] for f in self.injector.tick(step)]
        released = self._released(step)
        if fired or released:
            ray.get(self.ctx.telemetry.fault_state.remote(fired, released))

    def _released(self, step: int) -> list[int]:
        """Due mid_put kills whose replica has held no open claim for MID_PUT_RELEASE_S. While the Actor waits for
        such a kill, the staleness gate holds the rollout, so a replica with no claim never gets to the moment: the
        kill stops holding the Actor and fires at the replica's next put instead (its event says in which step)."""
        now, out = time.time(), []
        for w in self.injector.waiting:
            spec, i = w["spec"], w["index"]
            if not spec.mid_put or step < spec.at_step or i in self.released:
                continue
            if ray.get(self.queue.open_claims.remote(spec.replica)):
                self.claimless_since.pop(i, None)
            elif now - self.claimless_since.setdefault(i, now) >= MID_PUT_RELEASE_S:
                self.released.add(i)
                out.append(i)
        return out

    def _settle(self, ref, key) -> bool:
        """A run() call ended: True if it returned, False if its process died (a role's own error is
        re-raised here, naming it)."""
        try:
            ray.get(ref)
            ok = True
        except ray.exceptions.RayActorError as err:  # the process is gone
            ok = False
            log.warning("%s died: %s", key, type(err).__name__)
        if isinstance(key, tuple):
            index = key[1]
            if ok or self.pool.replicas[index].status in ("DRAINING", "REMOVING", "REMOVED"):
                self.pool.finished(index)  # no work left, drained, or removed by a forced scale-in
                return True
            return False
        self.futs.pop(ref, None)
        return ok

    def _recover(self, keys: list) -> None:
        """Bring back every role whose process died. Tier 1 restarts run in the background (the loop keeps
        watching, polling and injecting); a Tier 2 global restart stops the world."""
        limit = self.cfg.health.max_role_restarts
        names = [k if isinstance(k, str) else f"rollout-{k[1]}" for k in keys]
        over = [n for n in names if self.restarts[n] >= limit]
        cause = (("actor", "the Actor failed") if "actor" in names else
                 (over[0], f"{over[0]} failed more than health.max_role_restarts={limit} times") if over else None)
        if cause:
            # Roles found dead beside the cause are recorded too: the global restart brings them back with it.
            for key, name in zip(keys, names):
                if name != "actor" and not (isinstance(key, tuple) and key[0] == "spare"):
                    role, replica = ("rollout", key[1]) if isinstance(key, tuple) else (key, None)
                    pid = self.pool.replicas[key[1]].pid if isinstance(key, tuple) else self.pids.get(key)
                    self._event(role, 1, replica, pid=pid)["superseded_by_global_restart"] = True
            return self._global_restart(*cause)
        for key in keys:
            self._begin_restart(key)

    def _begin_restart(self, key, ev: dict | None = None) -> None:
        """Tier 1, first half: record, forget the dead process, start its replacement (ready later)."""
        if isinstance(key, tuple) and key[0] == "spare":  # a standby died while starting: start another
            self.pool.replicas[key[1]].status = "REMOVED"
            return self._refill_spare()
        if isinstance(key, tuple):
            index = key[1]
            rep = self.pool.replicas[index]
            ev = ev or self._event("rollout", 1, index, pid=rep.pid)
            self.restarts[f"rollout-{index}"] += 1
            self._forget(rep.pid)
            ray.kill(rep.handle)
            rep.status, rep.pid, rep.future = "RESTARTING", None, None
            ev["claims_cut_mid_put"] = ev.get("claims_cut_mid_put", 0) + ray.get(self.queue.partly_put.remote(index))
            ev["claims_returned"] = ev.get("claims_returned", 0) + ray.get(self.queue.release.remote(index))
            if self.pool.spare() is not None:
                return self._swap_in_spare(rep, ev)
            handle = self._create("rollout", index)
        else:
            ev = ev or self._event(key, 1, pid=self.pids.get(key))
            self.restarts[key] += 1
            self._forget(self.pids.pop(key, None))
            ray.kill(self.ctx.roles[key])
            handle = self._create(key)
        self.restarting[handle.ready.remote()] = (key, handle, ev)

    def _swap_in_spare(self, dead, ev: dict) -> None:
        """A warm standby takes the dead replica's place (and its `initial` standing) at once."""
        spare = self.pool.spare()
        ev["replaced_by_spare"] = self.pool.rid(spare.index)
        self._ready(ev, spare.handle)
        start = self.ctx.bus.oldest_unconsumed()
        ev["resume_step"] = start
        with self.pool.lock:
            dead.status = "REMOVED"
            spare.initial, spare.status = dead.initial, "ACTIVE"
            spare.future = self._start_replica(spare.handle, spare.index, start=start, recover=True)
        if self.ctx.roles.get("rollout") is dead.handle:
            self.ctx.roles["rollout"] = spare.handle
        self._refill_spare()

    def _refill_spare(self) -> None:
        rep = self.pool.add_spare()
        self.restarting[rep.handle.ready.remote()] = (("spare", rep.index), rep.handle, None)

    def _finish_restart(self, ref) -> None:
        """Tier 1, second half: the replacement is up; hand it its unfinished work and start it."""
        key, handle, ev = self.restarting.pop(ref)
        try:
            ray.get(ref)
            pid = ray.get(handle.pid.remote())
        except ray.exceptions.RayActorError:  # it died while starting: again
            return self._begin_restart(key, ev)
        if isinstance(key, tuple) and key[0] == "spare":
            rep = self.pool.replicas[key[1]]
            rep.pid, rep.status = pid, "SPARE"
            return
        self._ready(ev, handle)  # before its run(): an actor answers calls in order
        start = self.ctx.bus.oldest_unconsumed()
        ev["resume_step"] = start
        if isinstance(key, tuple):
            index = key[1]
            rep = self.pool.replicas[index]
            with self.pool.lock:
                rep.handle, rep.pid, rep.status = handle, pid, "ACTIVE"
                rep.future = self._start_replica(handle, index, start=start, recover=True)
            if index == 0:
                self.ctx.roles["rollout"] = handle
        else:
            self.ctx.roles[key], self.pids[key] = handle, pid
            task = task_of(key)
            ev["redelivered_partitions"] = redeliver(self.ctx.bus, task, start) if task else []
            self.futs[handle.run.remote(self.cfg.steps, start=start, recover=True)] = key

    def _check_heartbeats(self) -> None:
        limit = self.cfg.health.heartbeat_timeout_s
        ours = set(self.pids.values()) | {r.pid for r in self.pool.snapshot().values() if r.status == "ACTIVE"}
        for m in self.dcs.topology()["members"]:
            if m["pid"] in ours and missed_heartbeats(m, limit):
                log.warning("%s (pid %d) missed heartbeats for %.1f s: killing it", m["role"], m["pid"],
                            m["heartbeat_age_s"])
                self.events.append({"role": m["role"], "kind": "heartbeat_timeout", "pid": m["pid"],
                                    "t_detect": time.time() - self.t_start})
                _kill(m["pid"])  # its run() call fails next: recovered like any death

    def _died(self, pid: int) -> bool:
        """The role process `pid` is gone (or a zombie). Known only on a one-node cluster (the roles' pids are this
        machine's); on more nodes only injected kills are known."""
        return len(ray.nodes()) == 1 and exited(pid)

    def _forget(self, pid: int | None) -> None:
        """The DCS stops pairing receivers with a dead process."""
        if pid is None:
            return
        for m in self.dcs.topology()["members"]:
            if m["pid"] == pid and m["alive"]:
                self.dcs.mark_dead(m["id"])

    def _event(self, role: str, tier: int, replica: int | None = None, reason: str = "process died",
               pid: int | None = None) -> dict:
        """One recovery event per dead process (`pid`), matched to the injected kill of that process if any."""
        now = time.time()
        fault = self.injector.last_for(role, replica, pid)
        ev = {"role": role, "replica": replica, "pid": pid, "tier": tier, "reason": reason,
              "t_fault": (fault["t_fault"] - self.t_start) if fault else None, "t_detect": now - self.t_start,
              "steps_done_at_detect": len(self.ctx.records)}
        ev["detect_s"] = (now - fault["t_fault"]) if fault else None
        self.events.append(ev)
        if pid is not None:
            self.dead_pids.add(pid)
        return ev

    def _ready(self, ev: dict, handle) -> None:
        now = time.time()
        ev["t_ready"] = now - self.t_start
        ev["ready_s"] = ev["t_ready"] - (ev["t_fault"] if ev["t_fault"] is not None else ev["t_detect"])
        ev.update(ray.get(handle.recovery_info.remote(str(self.ckpt_dir))))
        if ev.get("boot_t0") is not None:  # when the replacement's process was created (run clock)
            ev["t_process"] = ev.pop("boot_t0") - self.t_start

    # ---- Tier 2 ---------------------------------------------------------------------------------------------
    def _global_restart(self, role: str, reason: str) -> None:
        cfg, ctx = self.cfg, self.ctx
        if self.global_restarts >= cfg.max_global_restart:
            raise RuntimeError(f"{reason}; max_global_restart={cfg.max_global_restart} global restarts are used up")
        if cfg.dcs.transport != "gloo":
            raise RuntimeError(f"{reason}; recovering the Actor needs dcs.transport: gloo (weights from a live "
                               f"peer), not {cfg.dcs.transport}")
        self.global_restarts += 1
        replica = int(role.split("-")[1]) if role.startswith("rollout-") else None
        cause_pid = self.pool.replicas[replica].pid if replica is not None else self.pids.get(role)
        ev = self._event("rollout" if replica is not None else role, 2, replica, reason=reason, pid=cause_pid)
        latest_before = self.dcs.topology()["latest"]
        # 1. Stop every role process (the bus and the driver's DCS copy survive), replacements being started too.
        # A process found already dead (killed at the same time as the cause, its death not yet seen) gets its own
        # event: one per fault, however many land at once.
        injected = {f["pid"] for f in self.injector.unmatched_kills()}
        stopped = []

        def stop(role_: str, replica: int | None, pid: int | None, handle) -> None:
            if pid is not None and pid != cause_pid and pid not in self.dead_pids:
                if pid in injected or self._died(pid):
                    self._event(role_, 1, replica, pid=pid)["superseded_by_global_restart"] = True
                else:
                    stopped.append(pid)
            self._forget(pid)
            ray.kill(handle)
            killed.append((pid, handle))

        killed: list = []
        for key, handle, pending_ev in self.restarting.values():
            ray.kill(handle)
            if isinstance(key, tuple) and key[0] == "spare":
                self.pool.replicas[key[1]].status = "REMOVED"
                continue
            pending_ev["superseded_by_global_restart"] = True
            if isinstance(key, tuple):
                self.pool.replicas[key[1]].status = "ACTIVE"  # restarted below with the others
        self.restarting = {}
        for name, h in list(ctx.roles.items()):
            if name != "rollout":
                stop(name, None, self.pids.pop(name, None), h)
        active = [i for i, r in self.pool.snapshot().items() if r.status in ("ACTIVE", "IDLE", "READY")]
        for i in active:
            rep = self.pool.replicas[i]
            stop("rollout", i, rep.pid, rep.handle)
            rep.future, rep.pid = None, None
        # ray.kill only asks: a process still running could fetch rows after the redelivery below (consumed, never
        # written) or claim groups under its replica index after the release (held open forever), and the run
        # would hang. Nothing is handed out again before every stopped process is gone.
        wait_exited(killed)
        for i in active:
            ray.get(self.queue.release.remote(i))
        self.futs = {}
        ev["stopped_pids"] = stopped  # the processes this restart stopped itself
        # 2. Resume point: the newest version a live process holds. Partitions before it are trained (their
        # versions are committed): drop them; every later row is handed out again to every task.
        topo = self.dcs.topology()
        resume = topo["reachable"]
        ev.update(latest_before=latest_before, resume_version=resume, rolled_back_versions=latest_before - resume)
        # A step the Actor finished (its version is reachable) but whose metrics row died with it before reaching
        # telemetry: the samples are trained and accounted in the ledger, only that step's row is missing.
        _, reported = ray.get(self.ctx.telemetry.snapshot.remote(10**9))
        ev["metrics_rows_lost"] = sorted(set(range(resume)) - set(self.ctx.records) - set(reported))
        for k in live_partitions(ctx.bus):
            if k < resume:
                ctx.bus.clear(k)
        start = min(resume, ctx.bus.oldest_unconsumed())
        for task in {task_of(n) for n in ctx.role_names if n != "rollout"} - {None}:
            redeliver(ctx.bus, task, start)
        # 3. Start everything again.
        new = {n: self._create(n, resume=n == "actor") for n in ctx.role_names if n != "rollout"}
        reps = {i: self._create("rollout", i) for i in active}
        ray.get([h.ready.remote() for h in [*new.values(), *reps.values()]])
        pids = ray.get([h.pid.remote() for h in [*new.values(), *reps.values()]])
        self._ready(ev, new["actor"])
        ev["resume_step"] = resume
        # Known from here on (a death from now is seen through its run() call, like any other).
        for (n, h), pid in zip(new.items(), pids):
            ctx.roles[n] = h
            self.pids[n] = pid
        rep_pids = dict(zip(reps, pids[len(new):]))
        self.futs[new["actor"].run.remote(cfg.steps, start=resume, recover=True)] = "actor"
        for n, h in new.items():
            if n != "actor":
                self.futs[h.run.remote(cfg.steps, start=start, recover=True)] = n
        for i, h in reps.items():
            rep = self.pool.replicas[i]
            with self.pool.lock:
                rep.handle, rep.pid, rep.status = h, rep_pids[i], "ACTIVE"
                rep.future = self._start_replica(h, i, start=start, recover=True)
        if 0 in reps:
            ctx.roles["rollout"] = reps[0]

    # ---- results ----------------------------------------------------------------------------------------------
    def final_state(self) -> tuple[int, dict]:
        """The newest weights; waiting for them also commits the last version in the ledger."""
        return self.dcs.latest_state(min_version=self.cfg.steps)

    def bus_calls(self) -> dict[str, dict[str, int]]:
        """The bus operations by kind of the driver and of every role process still alive (summary.json
        bus_calls_per_step; a process that died mid-run took its counts with it)."""
        handles = {n: h for n, h in self.ctx.roles.items() if n != "rollout"}
        handles.update({f"rollout-{i}": r.handle for i, r in self.pool.snapshot().items()})
        asked = {n: h.bus_calls.remote() for n, h in handles.items()}
        out = {"driver": dict(self.ctx.bus.calls)}
        for name, ref in asked.items():
            try:
                out[name] = ray.get(ref, timeout=10)
            except Exception:  # noqa: BLE001 -- a dead or removed process has no counts to give
                continue
        return out

    def account(self, version: int | None = None) -> list[int]:
        """The ledger once `version` (default: the last step's) is committed."""
        self.dcs.wait_committed(self.cfg.steps if version is None else version, timeout=60)
        return self.dcs.ledger()

    def metrics(self) -> dict:
        """The run now, for the control API's /metrics (keys: relax/api/prometheus.py METRICS). Called from the
        API's thread: it reads the DCS coordinator, the bus and the poll's newest step row."""
        topo = self.dcs.topology()
        row = self.ctx.live.get("row", {})
        ledger = self.dcs.ledger()
        rows = self.cfg.rows_per_step
        # Version v holds step v-1's samples, ids (v-1)*rows .. v*rows-1 (relax/roles/rollout.py).
        expected = {i for v in topo["committed"] if v >= 1 for i in range((v - 1) * rows, v * rows)}
        held = self.ctx.bus.held_rows()
        roles = {n: 0 for n in self.ctx.role_names if n != "rollout"}
        roles |= {f"rollout-{i}": 0 for i, r in self.pool.snapshot().items() if r.status != "REMOVED"}
        return {
            "steps_done": len(self.ctx.records), "steps_planned": self.cfg.steps,
            "weights_version": topo["latest"],
            "role_weights_version": {m["role"] + ("" if m["replica"] is None else f"-{m['replica']}"): max(m["holds"])
                                     for m in topo["members"] if m["alive"] and m["holds"]},
            "weight_transfers": topo["stats"]["transfers"], "weight_transfer_bytes": topo["stats"]["bytes"],
            "role_restarts": roles | dict(self.restarts), "global_restarts": self.global_restarts,
            "role_busy_share": row.get("busy_share"),
            "staleness_mean": row.get("staleness_mean"), "staleness_max": row.get("staleness_max"),
            "reward_mean": row.get("reward_mean"), "loss": row.get("loss"),
            "step_time_seconds": row.get("step_time_s"), "trainer_wait_seconds": row.get("trainer_wait_s"),
            "weight_sync_seconds": row.get("weight_sync_s"),
            "bus_rows_held": sum(held.values()), "bus_partitions_held": len(held),
            "bus_queue_depth": self.queue_depth(held),
            "samples_trained": len(ledger), "samples_lost": len(expected - set(ledger)),
            "samples_duplicated": len(ledger) - len(set(ledger)),
        }

    def queue_depth(self, held: dict[int, int]) -> dict[str, int] | None:
        """Rows on the bus each consuming role could fetch now and has not (its input queue), over the held
        partitions; None (left out of /metrics) if the bus cannot say, e.g. a partition cleared mid-count."""
        depth = {}
        try:
            for n in self.ctx.role_names:
                task = task_of(n) if n != "rollout" else None
                if task:
                    fields = role_class(n).reads(self.cfg)
                    depth[n] = sum(waiting(self.ctx.bus, k, task, fields) for k in held)
        except Exception as err:  # noqa: BLE001 -- a scrape must never fail the page
            log.debug("bus queue depth unavailable: %s", err)
            return None
        return depth

    def write_report(self) -> dict:
        topo = self.dcs.topology() if getattr(self, "dcs", None) is not None else {}
        if any("disk_bytes" in e for e in self.events):
            cold = disk_cold_reload(self.ckpt_dir / WEIGHTS)
            for e in self.events:
                if "disk_bytes" in e and cold is not None:
                    e["disk_cold_seconds"] = cold
        out = {"faults": [{k: v for k, v in f.items() if k != "matched"} | {"t_fault": f["t_fault"] - self.t_start}
                          for f in self.injector.fired],
               "events": self.events, "restarts": dict(self.restarts), "global_restarts": self.global_restarts,
               "dcs": {"transport": self.cfg.dcs.transport, "bucket_mb": self.cfg.dcs.bucket_mb,
                       **topo.get("stats", {})}}
        if self.api is not None:
            out["scale_operations"] = self.scaler.views()
        RunFolder(self.ctx.run_dir).write_recovery(out)
        return out

    def shutdown(self) -> None:
        self.injector.stop()
        if getattr(self, "dcs", None) is not None:
            self.write_report()
        if self.api is not None:
            self.api.stop()
        handles = [h for n, h in self.ctx.roles.items() if n != "rollout"]
        handles += list(self.pool.handles().values()) if hasattr(self, "pool") else []
        for h in handles:
            ray.kill(h)
        if getattr(self, "dcs", None) is not None:
            self.dcs.close()
        self.placement.release()


def disk_cold_reload(path: Path) -> float | None:
    """Seconds to torch.load the checkpoint with its pages evicted from the page cache first (a read from the
    disk, as after a node loss): the comparison for a DCS peer transfer, measured once at the end of the run."""
    import os

    import torch

    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    except (OSError, AttributeError):
        return None
    t0 = time.perf_counter()
    state = torch.load(path, weights_only=True)
    scratch = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():
        scratch[k].copy_(v)
    return time.perf_counter() - t0


def _kill(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
