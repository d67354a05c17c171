"""One engine replica under continuous batching, advanced finish by finish while it is fed.

`CostModel.generate` prices a call whose requests are all known at its start. A streaming replica that refills
(RolloutRole's feed, the simulator's refilling replica, the emulated engine's `generate_stream`) adds requests
while earlier ones decode, so the batch never drains at a claim's tail. `LiveEngine` is that engine: `add`
queues a request, `advance` admits what fits (FIFO, under max_running_requests, the caller's max_inflight and
the KV cache, each request reserving prompt + response), prefills the newcomers and decodes to the next finish.
Its clock `t` counts engine seconds only: an idle engine's clock stands still (`CostModel.generate` is one
LiveEngine run over a fixed list, so both price the same work alike).
"""

from __future__ import annotations

import heapq
import math
from collections import deque



def _exact_sum_max(a: float, b: float, c: float, d: float, n: int) -> float:
    """sum_{j=0}^{n-1} max(a + b j, c + d j), exactly (both arms linear in j)."""
    if n <= 0:
        return 0.0

    def arm(x, y, lo, hi):  # sum_{j=lo}^{hi-1} (x + y j)
        m = hi - lo
        return m * x + y * (lo + hi - 1) * m / 2 if m > 0 else 0.0

    if b == d:
        return arm(max(a, c), b, 0, n)
    j = (c - a) / (b - d)  # arms cross at j
    first_a = a >= c  # arm 1 is the max at j = 0
    k = min(max(math.ceil(j) if j > 0 else 0, 0), n)
    if first_a:  # arm 1 until it is overtaken (b < d)
        return arm(a, b, 0, k) + arm(c, d, k, n) if b < d else arm(a, b, 0, n)
    return arm(c, d, 0, k) + arm(a, b, k, n) if b > d else arm(c, d, 0, n)


class LiveEngine:
    def __init__(self, cost, max_running: int | None = None):
        self.cost = cost
        self.cap = cost.kv_capacity_tokens() if cost.hw.kind == "gpu" else float("inf")
        limit = int(cost.hw.rollout.max_running_requests.at(cost.b))
        self.max_run = min(limit, max_running) if max_running else limit
        self.t, self.step, self.context, self.reserved = 0.0, 0, 0.0, 0.0
        self.active: list[tuple[int, int, object]] = []  # heap of (finish step, arrival, key)
        self.sizes: dict[int, tuple[float, int]] = {}  # arrival -> (prompt tokens, response tokens)
        self.pending: deque[tuple[int, object]] = deque()  # (arrival, key) not admitted yet
        self.arrivals = 0
        self.w_read = self.kv_read = self.t_accounted = 0.0

    def __len__(self) -> int:
        """Requests in the engine: decoding or queued for admission."""
        return len(self.active) + len(self.pending)

    def free(self) -> int:
        """Requests the engine would take now without queueing one past max_running."""
        return max(0, self.max_run - len(self))

    def add(self, key, prompt: float, response: int) -> None:
        a = self.arrivals
        self.arrivals += 1
        self.sizes[a] = (prompt, max(int(response), 1))
        self.pending.append((a, key))

    def _admit(self) -> None:
        admitted = []
        while self.pending and len(self.active) < self.max_run:
            a, key = self.pending[0]
            p, n = self.sizes[a]
            if self.active and self.reserved + p + n > self.cap:
                break
            self.pending.popleft()
            admitted.append(p)
            self.reserved += p + n
            self.context += p
            heapq.heappush(self.active, (self.step + n, a, key))
        if admitted:
            self.t += self.cost.prefill_time(admitted)

    def advance(self) -> list:
        """Admit, then decode to the next finish; returns the keys that finished (at `self.t`). Call it only
        while len(self) > 0."""
        self._admit()
        c = self.cost
        n_steps = self.active[0][0] - self.step
        b = len(self.active)
        a, bm, cc, dm = c.decode_arms(b)
        self.t += _exact_sum_max(a + bm * self.context, bm * b, cc + dm * self.context, dm * b, n_steps) \
            + n_steps * c.step_overhead
        self.w_read += n_steps * c._touched(b)
        self.kv_read += n_steps * self.context + b * n_steps * (n_steps - 1) / 2
        self.context += b * n_steps
        self.step += n_steps
        done = []
        while self.active and self.active[0][0] == self.step:
            _, a, key = heapq.heappop(self.active)
            p, n = self.sizes.pop(a)
            self.context -= p + n
            self.reserved -= p + n
            done.append(key)
        return done

    def run(self, requests: list[tuple[float, int]]) -> tuple[float, list[float]]:
        """Every request given at once, in order: (engine seconds, finish time of each); accounted."""
        for i, (p, n) in enumerate(requests):
            self.add(i, p, n)
        finish = [0.0] * len(requests)
        while len(self):
            for i in self.advance():
                finish[i] = self.t
        self.account()
        return self.t, finish

    def account(self) -> None:
        """Add the decode reads and engine seconds since the last call to the cost model's totals (implied())."""
        self.cost._count_reads(self.w_read, self.kv_read)
        self.cost.acc["generate_s"] += self.t - self.t_accounted
        self.w_read = self.kv_read = 0.0
        self.t_accounted = self.t
