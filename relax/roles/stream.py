"""Request-level streaming that refills (rollout.max_inflight): one engine stream per Rollout replica, kept full
across GroupQueue claims and partitions.

`ClaimFeed.feed` is the engine's feed (relax/engines/feed.py). Whenever the engine has a free slot it hands out
the next requests of the claims this replica holds, and claims more groups when it has none left: from
partition k, or from k + 1 once the staleness gate admits k + 1 and the loaded weights are new enough
(>= k + 1 - max_staleness; a request's first version is the one loaded when it joins, and versions only grow).
So a claim's long tail decodes beside the next claim's requests instead of holding the engine at a batch of
one or two, as slime's and AReaL's engines are refilled.
- Without partial rollout the feed takes no new work once a newer version is in the staging: the engine
  drains, loads it and goes on (in-flight requests are never restarted, and staleness stays as low as before).
- Each group goes to the bus the moment its last sample finishes (DAPO: a degenerate group is drawn again first,
  its fresh prompt's requests ahead of everything waiting); a claim is finished with the GroupQueue when
  its last group is on the bus. A replica may hold several open claims: on a crash the supervisor hands every
  one of them out again (a claim cut mid-put is flagged maybe_put, as before).
- The puts travel on a `Putter`'s thread, in order, while the engine decodes on: a put is a few Ray calls (the
  GroupQueue's putting / landed, the bus; 50-85 ms on 2 loaded cores), and made in the decode loop it stalled every
  live sequence for that long at every group's end.
- `ClaimFeed.next` / `wait` / `stop` say why the feed ran dry, for the replica's loop: enter the next partition
  through the blocking gate, wait for others' open work, or end.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import ray

from relax.bus.gate import can_start

QUIET_S = 0.02  # after a claim attempt that found nothing, the feed asks the queue / gate again after this


class Putter:
    """Puts a replica's finished groups on the bus from one background thread, in order, one group a put, while
    the engine decodes on: `put(k, item)` runs on that thread. `submit` raises the error of a put that failed since
    the last call; `drain` waits until everything submitted is put.

    Groups are not merged into one put: the simulator streams group by group, and merged puts hand the downstream
    services calls of several groups, which pad to the longest in each micro-batch (relax/trainers/budget.py). On 2
    CPU cores merging measured 0.66-0.71x the step (fewer calls); in the emulated beyond-the-paper run it was not
    faster (325 and 327 s a step against 257-335 without, on a machine too noisy to settle it). The README's
    "Streaming rollout" says more."""

    def __init__(self, put):
        self.put = put
        self.items: deque = deque()  # (k, item) not yet taken by the put thread
        self.busy, self.error, self.closed = False, None, False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="relax-put", daemon=True)
        self.thread.start()

    def submit(self, k: int, item) -> None:
        with self.cv:
            self._raise()
            self.items.append((k, item))
            self.cv.notify_all()

    def drain(self) -> None:
        with self.cv:
            while self.items or self.busy:
                self.cv.wait()
            self._raise()

    def close(self) -> None:
        self.drain()
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error  # in the replica's loop: a failed put ends it, as a put made there would

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.items and not self.closed:
                    self.cv.wait()
                if not self.items:
                    return
                k, item = self.items.popleft()
                self.busy = True
            try:
                self.put(k, item)
            except BaseException as e:  # noqa: BLE001 - handed to the replica's loop (submit / drain)
                with self.cv:
                    self.error = e
            finally:
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()


class ClaimFeed:
    def __init__(self, role, k: int):
        self.role, self.k = role, k
        self.putter = Putter(self._put)
        self.claims: dict[int, dict] = {}  # cid -> {claim, step, groups, prompts, limits, done, attempt, left, t0}
        self.buffer: deque = deque()  # (cid, group, sample) not yet given to the engine
        self.requests: list[tuple[int, int, int]] = []  # this stream's request number -> (cid, group, sample)
        self.next = self.wait = self.stop = False
        self.quiet_until = 0.0
        self.cpu0 = time.process_time()

    def begin(self) -> None:
        """A new engine stream: its requests are numbered from 0 again, and why the last one ran dry (next / wait,
        which the replica's loop has acted on) is spent: the new stream claims at once. (A `next` left standing
        made a replica whose gate opened within QUIET_S end its new stream at once and skip a partition.)"""
        self.requests = []
        self.next = self.wait = False
        self.quiet_until = 0.0

    def feed(self, free: int) -> list[tuple[list[int], int]]:
        out = []
        while len(out) < free and (self.buffer or self._claim(free - len(out))):
            cid, g, j = self.buffer.popleft()
            c = self.claims[cid]
            out.append((c["prompts"][g], c["limits"][g][j]))
            self.requests.append((cid, g, j))
        return out

    def _claim(self, free: int) -> bool:
        """Open one more claim, of at most the groups `free` slots start now (True), or say why not (False: next /
        wait / stop, or a newer version to load). Claiming no more than it can start keeps a replica from
        holding groups back that an idle replica could start."""
        role, s = self.role, self.role.cfg.max_staleness
        if self.stop or time.time() < self.quiet_until:
            return False
        if not role.cfg.rollout.partial and role.weights.staged_version() > role.version:
            return False  # drain, then load it (RolloutRole._run_streaming)
        self.next = self.wait = False
        most = -(-free // role.cfg.rollout.group_size)
        while True:
            claim = ray.get(role.queue.claim.remote(role.replica, self.k, most))
            if claim.get("stop"):
                self.stop = True
                return False
            if claim.get("next"):
                k = self.k + 1
                if role.version >= k - s and can_start(k, role.bus.oldest_unconsumed(), s):
                    self.k = k  # enter k + 1 mid-stream: the gate admits it and the loaded weights may start it
                    continue
                self.next, self.quiet_until = True, time.time() + QUIET_S
                return False
            if claim.get("wait"):
                self.wait, self.quiet_until = True, time.time() + QUIET_S
                return False
            if self._open(claim):
                return True

    def _open(self, claim: dict) -> bool:
        role = self.role
        groups = role.groups_to_generate(claim)
        if not groups:
            ray.get(role.queue.finish.remote(claim["cid"], 0))
            return False
        j, G = claim["step"], role.cfg.rollout.group_size
        prompts, limits = {}, {}
        for g in groups:
            prompts[g] = role.tokenizer.encode(role.data[role.prompt_index(j, g, 0)].prompt)
            limits[g] = role.emu.limits(j, [g]) if role.emu is not None else [role.cfg.rollout.max_new_tokens] * G
        self.claims[claim["cid"]] = {"claim": claim, "step": j, "groups": groups, "prompts": prompts,
                                     "limits": limits, "done": {g: {} for g in groups},
                                     "attempt": dict.fromkeys(groups, 0), "left": len(groups), "t0": time.time()}
        self.buffer.extend((claim["cid"], g, x) for g in groups for x in range(G))
        return True

    def finished(self, number: int, gen) -> None:
        """The engine finished request `number`: a group whose last sample this is goes to the bus, and a claim
        whose last group that was is finished with the GroupQueue."""
        role, G = self.role, self.role.cfg.rollout.group_size
        cid, g, x = self.requests[number]
        c = self.claims[cid]
        done = c["done"][g]
        done[x] = gen
        if len(done) < G:
            return
        j, gens = c["step"], [done[i] for i in range(G)]
        again = role.redraw(j, g, c["attempt"][g], gens)
        if again is not None:  # DAPO: the slot's next prompt goes to the engine before anything else waiting
            c["prompts"][g], c["done"][g] = again, {}
            c["attempt"][g] += 1
            self.buffer.extendleft((cid, g, x) for x in reversed(range(G)))
            return
        c["left"] -= 1
        cpu = None
        if c["left"] == 0:
            del self.claims[cid]
            cpu, self.cpu0 = time.process_time() - self.cpu0, time.process_time()  # claims overlap: no double count
        self.putter.submit(j, (c, g, c["prompts"][g], gens, c["attempt"][g], cpu, time.time()))

    def _put(self, k: int, item: tuple) -> None:
        """On the put thread: one group of partition k to the bus; after its claim's last group, the claim is
        finished with the GroupQueue."""
        role, (c, g, prompt, gens, attempt, cpu, ended) = self.role, item
        role.put_claim(c["claim"], role.group_rows(k, g, prompt, gens, attempt))
        # from the group's last sample to its rows on the bus (its CPU is in the claim's `generate`)
        role.rec.record("group_done", ended, time.time(), step=k, group=g)
        if cpu is not None:
            ray.get(role.queue.finish.remote(c["claim"]["cid"], len(c["groups"])))
            role.rec.record("generate", c["t0"], time.time(), step=k, cpu=cpu, groups=len(c["groups"]),
                            replica=role.replica)
