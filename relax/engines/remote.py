"""A rollout engine behind SGLang's native HTTP API, with the interface the Rollout role uses on TorchEngine.

`rollout.engine` picks what generates (relax/roles/rollout.py builds it with `make_engine`):
- `torch`: TorchEngine in the Rollout role's own process (no HTTP).
- `torch_http`: each Rollout replica launches our torch engine server (`python -m relax.engines.http_server`) and
  drives it over HTTP through `EngineClient` -- the CPU stand-in that runs exactly the SGLang client path.
- `sglang`: each Rollout replica launches `python -m sglang.launch_server` (`sglang_server_args`) on the GPUs Ray
  gave the replica.
- `rollout.engine_urls`: engines already running (torch_http or sglang servers), one per replica: connect, launch
  nothing.

`RemoteEngine` keeps TorchEngine's meaning: `generate` returns `Generation`s with the sampled tokens, their
log-probs under the engine's temperature (SGLang's output_token_logprobs), finish_reason, the engine's weight
version, and `extras["routed_experts"]` for R3. `update_weights(state, version)` goes pause -> flush -> update ->
continue (`WeightSync`: base64 safetensors buckets for the torch server, a DCS broadcast group for SGLang).
`sleep()` pauses the server (SGLang also releases its GPU memory); `wake(state, version)` loads and continues.

A launched server runs under a small watchdog (`python -m relax.engines.remote --parent PID -- argv...`) in its
own session: when the Rollout process ends, even by SIGKILL (the supervisor's `ray.kill`), the watchdog ends the
server's process group. The role stops it by PID (`stop()`); a server that died makes every later call raise
`EngineDied`, so the replica fails and the supervisor's Tier 1 restart relaunches it with a fresh server.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import numpy as np

from relax.engines.feed import Feed
from relax.engines.process import terminate
from relax.engines.sglang import EngineClient, EngineError, WeightSync, sglang_server_args
from relax.engines.torch_engine import Generation

REMOTE_ENGINES = ("torch_http", "sglang")


class EngineDied(RuntimeError):
    """The engine server this replica launched is gone (or an external engine stopped answering)."""


def sglang_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


def check_engine_available(cfg) -> None:
    """Fail before anything runs when the configured engine cannot start here."""
    if cfg.rollout.engine != "torch" and (cfg.task.kind != "text" or cfg.model.kind == "tiny_omni"):
        raise RuntimeError(f"rollout.engine: '{cfg.rollout.engine}' generates text only; {cfg.task.kind} tasks "
                           "(media inputs, multi-turn tool episodes) run on the in-process 'torch' engine for now")
    if cfg.rollout.engine == "sglang" and not cfg.rollout.engine_urls and not sglang_available():
        raise RuntimeError("rollout.engine: 'sglang' launches `python -m sglang.launch_server`, but the sglang "
                           "package is not importable in this environment (install sglang on the GPU nodes, "
                           "give running engines in rollout.engine_urls, or use engine 'torch' / 'torch_http')")


# --- the server process ----------------------------------------------------------------------------------------
class OwnedServer:
    """A server process this replica launched (under the watchdog); stopped by PID."""

    def __init__(self, argv: list[str], url: str, log_path: str | None = None, env: dict | None = None):
        self.url = url
        watch = [sys.executable, "-m", "relax.engines.remote", "--parent", str(os.getpid()), "--", *argv]
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.log_path = log_path
        # Its own session: Ray ending the role's worker (and its process group) leaves the watchdog to clean up.
        self.proc = subprocess.Popen(watch, stdout=log, stderr=subprocess.STDOUT if log_path else subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_healthy(self, client: EngineClient, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.alive():
                raise EngineDied(f"engine server (pid {self.pid}) exited with code {self.proc.returncode} before "
                                 f"becoming healthy{self._log_hint()}")
            if client.health():
                return
            time.sleep(0.2)
        self.stop(2.0)
        raise EngineDied(f"engine server at {self.url} not healthy after {timeout:.0f} s{self._log_hint()}")

    def _log_hint(self) -> str:
        return f" (log: {self.log_path})" if self.log_path else ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the watchdog (it ends the server's process group), SIGKILL after `timeout`."""
        return terminate(self.proc, timeout)


def _server_preexec() -> None:
    """In the server child: its own session (its process group is ended as one) and, on Linux, SIGKILL when the
    watchdog itself dies."""
    os.setsid()
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _watch(parent: int, argv: list[str]) -> int:
    """Run argv in its own session; end its process group when the parent goes away or on SIGTERM."""
    child = subprocess.Popen(argv, preexec_fn=_server_preexec)

    def end(*_):
        try:
            terminate(child, 5.0, group=True)
        except ProcessLookupError:
            pass
        sys.exit(child.returncode if child.returncode is not None else 1)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    while child.poll() is None:
        if os.getppid() != parent:  # the Rollout process is gone (killed): take the server with it
            end()
        time.sleep(0.5)
    return child.returncode


# --- the engine ------------------------------------------------------------------------------------------------
class _Routing:
    """What the Rollout role reads of TorchEngine.capture (`num_experts`)."""

    def __init__(self, num_experts: int):
        self.num_experts = num_experts


class RemoteEngine:
    """The Rollout role's engine interface over one SGLang-API server (launched by this process, or external)."""

    def __init__(self, client: EngineClient, *, temperature: float = 1.0, top_p: float = 1.0,
                 record_routing: bool = False, num_experts: int = 0, server: OwnedServer | None = None,
                 transport: str = "tensor", backend: str = "gloo", device: str = "cpu", sglang: bool = False):
        self.client = client
        self.server = server
        self.temperature, self.top_p = temperature, top_p
        self.sglang = sglang
        self.version = 0
        self.asleep = False
        self.capture = None
        self.moe_shape = None
        if record_routing:
            info = client.server_info()
            layers = int(info.get("num_moe_layers") or 0)
            top_k = int(info.get("num_experts_per_tok") or 0)
            if not layers or not top_k:
                raise EngineError(f"{client.url}: moe.r3 needs routed experts, but the server reports no MoE layers")
            self.moe_shape = (layers, top_k)
            self.capture = _Routing(num_experts)
        self.sync = WeightSync([client], transport, backend=backend, device=device, pause_mode="in_place")

    # --- failure ------------------------------------------------------------------------------------------
    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EngineError as e:
            if self.server is not None and not self.server.alive():
                raise EngineDied(f"engine server (pid {self.server.pid}) at {self.client.url} exited with code "
                                 f"{self.server.proc.returncode}: {e}") from e
            if not self.client.health():
                raise EngineDied(f"engine at {self.client.url} does not answer /health: {e}") from e
            raise

    # --- generation -----------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
        if self.asleep:
            raise RuntimeError("engine is asleep: wake() it with weights before generating")
        gens = self._call(self.client.generate, prompts, max_new_tokens, temperature=self.temperature,
                          top_p=self.top_p, return_routed_experts=self.capture is not None, moe_shape=self.moe_shape)
        for g in gens:
            if g.finish_reason == "abort":
                raise EngineError(f"{self.client.url}: a request was aborted by the server")
            if self.capture is not None:
                if "routed_experts" not in g.extras:
                    raise EngineError(f"{self.client.url}: no routed experts in the reply (moe.r3)")
                g.extras["routed_experts"] = np.ascontiguousarray(g.extras["routed_experts"])
            g.extras.pop("text", None)
        return gens

    def generate_stream(self, feed: Feed, max_inflight: int,
                        between: Callable[[], None] | None = None) -> Iterator[tuple[int, Generation]]:
        """Request-level streaming over `feed` (relax/engines/feed.py): up to `max_inflight` one-prompt requests
        in flight at once (the server batches them continuously), refilled from the feed as replies arrive;
        yields (request number, Generation) per reply. `between()` runs after each reply: a partial rollout's
        weight update there pauses the server, updates in place and continues, so requests in flight finish on
        the new weights (first/last version: at submit / reply)."""
        with ThreadPoolExecutor(max_workers=max(1, max_inflight)) as pool:
            futures: dict = {}
            numbers = itertools.count()
            try:
                while True:
                    free = max_inflight - len(futures)
                    for p, limit in (feed(free) if free > 0 else []):
                        futures[pool.submit(self.generate, [p], limit)] = (next(numbers), self.version)
                    if not futures:
                        return
                    done, _ = wait(futures, return_when=FIRST_COMPLETED)
                    for fut in done:
                        i, first = futures.pop(fut)
                        gen = fut.result()[0]
                        gen.weight_version, gen.last_version = first, self.version
                        yield i, gen
                    if between is not None:
                        between()
            finally:
                for fut in futures:
                    fut.cancel()

    # --- weights ---------------------------------------------------------------------------------------------
    def update_weights(self, state: dict, version: int) -> None:
        """pause -> flush -> update (bucketed) -> continue; the server's weight version becomes `version`."""
        if self.asleep:
            return self.wake(state, version)
        self._call(self.sync.push, iter(state.items()), version)
        self.version = version

    def sleep(self) -> int:
        """Pause the server; SGLang also releases its GPU memory (the torch server keeps its weights: 0 freed)."""
        self._call(self.client.pause, "in_place")
        if self.sglang:
            self._call(self.client._call, "POST", "/release_memory_occupation", {})
        self.asleep = True
        return 0

    def wake(self, state: dict, version: int) -> None:
        if self.sglang and self.asleep:
            self._call(self.client._call, "POST", "/resume_memory_occupation", {})
        self.asleep = False
        self._call(self.sync.push, iter(state.items()), version)  # ends with continue_generation
        self.version = version

    def pause(self) -> None:
        self._call(self.client.pause, "in_place")

    def resume(self) -> None:
        self._call(self.client.continue_generation)

    def server_weight_version(self) -> str:
        return self._call(self.client.weight_version)

    def close(self) -> None:
        try:
            self.sync.close()
        except Exception:  # noqa: BLE001 - the server may already be gone
            pass
        if self.server is not None:
            self.server.stop()
        self.client.close()


def _num_experts(cfg) -> int:
    m = cfg.model
    if m.kind == "tiny_qwen3_moe":
        return m.num_experts
    if m.kind == "hf" and m.path:
        from pathlib import Path

        conf = Path(m.path) / "config.json"
        if conf.is_file():
            c = json.loads(conf.read_text())
            return int(c.get("num_experts") or c.get("num_local_experts") or 0)
    return 0


def make_remote_engine(cfg, replica: int, *, threads: int = 1, log_dir: str | None = None,
                       health_timeout: float = 600.0) -> RemoteEngine:
    """The engine of Rollout replica `replica`: connect to rollout.engine_urls[replica], or launch its server."""
    from relax.engines.process import free_port

    r = cfg.rollout
    sglang = r.engine == "sglang"
    kw = dict(temperature=r.temperature, top_p=r.top_p, record_routing=cfg.moe.r3, num_experts=_num_experts(cfg),
              sglang=sglang)
    if sglang:
        import torch

        gpu = torch.cuda.is_available()
        kw.update(transport="distributed", backend="nccl" if gpu else "gloo", device="cuda" if gpu else "cpu")
    if r.engine_urls:
        client = EngineClient(r.engine_urls[replica])
        try:
            client.wait_healthy(health_timeout)
        except EngineError as e:
            raise EngineDied(f"rollout.engine_urls[{replica}]: {e}") from e
        return RemoteEngine(client, **kw)
    check_engine_available(cfg)
    port = free_port()
    host = "127.0.0.1"
    if sglang:
        argv = sglang_server_args(cfg, replica, port=port, host=host, python=sys.executable)
    else:
        argv = [sys.executable, "-m", "relax.engines.http_server", "--model", json.dumps(cfg.model.model_dump()),
                "--host", host, "--port", str(port), "--seed", str(cfg.seed + 1000 * replica + 1),
                "--dtype", r.dtype, "--threads", str(threads),
                # the most sequences this replica has in flight: a chunk of groups, or its streaming cap
                "--max-running-requests", str(max(r.max_inflight or 0, r.chunk_groups * r.group_size))]
    log = None
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log = os.path.join(log_dir, f"{r.engine}_engine_{replica}.log")
    server = OwnedServer(argv, f"http://{host}:{port}", log)
    client = EngineClient(server.url)
    try:
        server.wait_healthy(client, health_timeout)
        return RemoteEngine(client, server=server, **kw)
    except BaseException:
        server.stop(2.0)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="watchdog: run an engine server; end it when the parent process ends")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not cmd:
        p.error("no command")
    return _watch(args.parent, cmd)


if __name__ == "__main__":
    sys.exit(main())
