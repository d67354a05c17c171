"""The emulated rollout engine: TorchEngine's interface, synthetic tokens, the cost model's time.

A call's requests carry their modelled response lengths as per-request limits (the Rollout role passes the
sim's lengths for its sample ids); each response gets ceil(length / token_scale) synthetic tokens. The call
sleeps the cost model's duration for it on the target hardware (continuous batching on one engine, or
`virtual_replicas` engines for a schedule that runs one rollout process), over the compression. Streaming
(`generate_stream`) yields each request at its modelled finish time, the engine fed as slots free (relax/sim/
live.py); a weight update in between (partial rollout) pauses every later finish by the time it took. Weight
loads, sleep and wake take their modelled times.
"""

from __future__ import annotations

import itertools
import threading
import time

import torch

from relax.engines.feed import Feed, limits
from relax.engines.torch_engine import Generation
from relax.sim.live import LiveEngine

UNIFORM_LOG_PROB = -4.55  # log(1/95): a synthetic token drawn uniformly from the printable characters


class EmulatedEngine:
    def __init__(self, model, tokenizer, emu, *, seed: int = 0, virtual_replicas: int = 1, chunk_requests=None,
                 **_ignored):
        self.model, self.tokenizer, self.emu = model, tokenizer, emu
        self.gen = torch.Generator().manual_seed(seed)
        self.virtual, self.chunk = virtual_replicas, chunk_requests
        self.version = 0
        self.asleep = False
        self.capture = None
        self._lock = threading.RLock()
        self.low, self.high = 3, tokenizer.vocab_size  # printable ids (past pad, bos, eos)

    # --- weights -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def _copy(self, state) -> None:
        for name, p in self.model.named_parameters():
            p.data.copy_(state[name])

    def update_weights(self, state, version: int) -> None:
        with self._lock, self.emu.pace("weight_load", self.emu.cost.weight_load_time()):
            self._copy(state)
            self.version = version

    def sleep(self) -> int:
        with self._lock, self.emu.pace("sleep", self.emu.cost.sleep_time()):
            self.asleep = True
        return int(self.emu.cost.weight_bytes)  # the target's weights, released to host memory

    def wake(self, state, version: int) -> None:
        with self._lock, self.emu.pace("wake", self.emu.cost.wake_time()):
            self._copy(state)
            self.version, self.asleep = version, False

    def pause(self) -> None:
        return None

    def resume(self) -> None:
        return None

    # --- generation ------------------------------------------------------------------------------------
    def _generation(self, modelled: int, first: int, last: int | None = None) -> Generation:
        n = self.emu.real_len(modelled)
        ids = torch.randint(self.low, self.high, (n,), generator=self.gen).tolist()
        reason = "length" if modelled >= self.emu.cap else "stop"
        return Generation(ids, [UNIFORM_LOG_PROB] * n, reason, first, last_version=last)

    def generate(self, prompts: list[list[int]], max_new_tokens) -> list[Generation]:
        """`max_new_tokens`: the modelled response length of each request."""
        lengths = limits(max_new_tokens, len(prompts))
        with self._lock:
            if self.asleep:
                raise RuntimeError("engine is asleep: wake() it with weights before generating")
            t0 = time.time()
            dur, _ = self.emu.generate_time(lengths, self.virtual, self.chunk)
            out = [self._generation(L, self.version) for L in lengths]
            self.emu.wait_until(t0, dur, "generate")
            return out

    def generate_stream(self, feed: Feed, max_inflight: int, between=None):
        """Yields (request number, Generation) at each request's modelled finish, at most `max_inflight` in
        flight; the feed's limits are the modelled response lengths. The engine is a LiveEngine (relax/sim/
        live.py), fed whenever it has a free slot, so requests that join mid-call are priced where they join.
        A row's first version is the one loaded when it joined; with partial rollout a weight update in between
        pauses every later finish by the time it took."""
        with self._lock:
            if self.asleep:
                raise RuntimeError("engine is asleep: wake() it with weights before generating")
            eng = LiveEngine(self.emu.cost, max_inflight)
            t0, c, shift = time.time(), self.emu.compression, 0.0  # shift: real seconds paused for weight loads
            numbers, joined = itertools.count(), {}  # request number -> (modelled length, first version)
            while True:
                free = eng.free()
                for _, length in (feed(free) if free else []):
                    i = next(numbers)
                    joined[i] = (length, self.version)
                    eng.add(i, self.emu.prompt, length)
                if not len(eng):
                    break
                done = eng.advance()
                if between is not None:
                    tb = time.time()
                    between()
                    shift += time.time() - tb
                left = t0 + shift + eng.t / c - time.time()
                if left > 0:
                    time.sleep(left)
                for i in done:
                    length, first = joined.pop(i)
                    v = self.version
                    yield i, self._generation(length, first, v if v != first else None)
            eng.account()
            self.emu.wait_until(t0 + shift, eng.t, "generate")
