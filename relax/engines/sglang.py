"""SGLang rollout engines: launch commands, Ray-managed server processes, and an HTTP client for any server that
speaks SGLang's native API (a real `sglang.launch_server`, or our torch engine in `relax.engines.http_server`).

- `sglang_server_args(cfg, replica, port)` builds `python -m sglang.launch_server ...` from the experiment config
  (model path, TP size = rollout GPUs / replicas, dtype, seed, routed experts for MoE, memory saver when colocated).
- `SGLangProcess` is a Ray actor that owns one server process on the GPUs Ray gave it (CUDA_VISIBLE_DEVICES is set
  by Ray); `launch_sglang_engines` starts one per replica, optionally inside placement-group bundles (relax.placement).
- `EngineClient(url)` drives one server: generate with per-token log-probs (and routed experts for MoE),
  pause / flush / continue, weight updates from disk, from tensors, or from a DCS broadcast group, health checks.
  `connect_engines(urls)` accepts already-running engines by URL (the scale-out API's external mode).
- `WeightSync` pushes a new weight version to every engine: pause -> flush -> update (bucketed) -> continue.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch

from relax.engines.torch_engine import Generation


class EngineError(RuntimeError):
    """A server answered with an error (its message is kept) or did not answer."""


# --- launch -----------------------------------------------------------------------------------------------
def _model_is_moe(cfg) -> bool:
    m = cfg.model
    if m.kind == "tiny_qwen3_moe":
        return True
    if m.kind == "hf" and m.path:
        import json
        from pathlib import Path

        conf = Path(m.path) / "config.json"
        if conf.is_file():
            c = json.loads(conf.read_text())
            return bool(c.get("num_experts") or c.get("num_local_experts"))
        return "moe" in m.path.lower() or "-a3b" in m.path.lower() or "a22b" in m.path.lower()
    return False


def engine_tp_size(cfg) -> int:
    """GPUs per rollout engine: the rollout pool split evenly over the replicas."""
    gpus, replicas = cfg.resources.rollout.gpus, cfg.rollout.replicas
    if gpus <= 0:
        raise ValueError("resources.rollout.gpus: SGLang engines need GPUs (set resources.rollout.gpus > 0)")
    if gpus % replicas or int(gpus) != gpus:
        raise ValueError(f"resources.rollout.gpus={gpus} must be a whole multiple of rollout.replicas={replicas}")
    return int(gpus) // replicas


def sglang_server_args(cfg, replica: int, *, port: int, host: str = "0.0.0.0", nccl_port: int | None = None,
                       mem_fraction: float | None = None, python: str = "python") -> list[str]:
    """The `sglang.launch_server` command of one rollout replica (as an argv list)."""
    if not cfg.model.path:
        raise ValueError("model.path: SGLang loads a Hugging Face folder; set model.kind=hf and model.path")
    tp = engine_tp_size(cfg)
    colocate = cfg.mode == "colocate"
    cmd = [python, "-m", "sglang.launch_server", "--model-path", cfg.model.path, "--host", host, "--port", str(port),
           "--tp-size", str(tp), "--dtype", cfg.rollout.dtype, "--random-seed", str(cfg.seed + replica),
           "--mem-fraction-static", str(mem_fraction if mem_fraction is not None else 0.8),
           "--weight-version", "0", "--skip-server-warmup"]
    if nccl_port is not None:
        cmd += ["--nccl-port", str(nccl_port)]
    if _model_is_moe(cfg):
        cmd.append("--enable-return-routed-experts")  # routed experts for R3 (routing replay in the trainer)
    if colocate:
        cmd.append("--enable-memory-saver")  # release / resume GPU memory while the actor trains
    return cmd


def sglang_command(cfg, replica: int, *, port: int, **kw) -> str:
    return shlex.join(sglang_server_args(cfg, replica, port=port, **kw))


def _sglang_process_cls():
    import ray

    @ray.remote
    class SGLangProcess:
        """Owns one `sglang.launch_server` process on the GPUs Ray reserved for this actor."""

        def __init__(self, argv: list[str], port: int, log_path: str | None = None, env: dict | None = None):
            import ray as _ray

            self.port = port
            self.host = _ray.util.get_node_ip_address()
            penv = dict(os.environ, **(env or {}))
            log = open(log_path, "ab") if log_path else subprocess.DEVNULL
            argv = [sys.executable if a == "python" else a for a in argv]
            if "--host" in argv:  # listen on the address Ray advertises (loopback for a local run), not every one
                argv[argv.index("--host") + 1] = self.host
            self.proc = subprocess.Popen(argv, env=penv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def url(self) -> str:
            return f"http://{self.host}:{self.port}"

        def pid(self) -> int:
            return self.proc.pid

        def alive(self) -> bool:
            return self.proc.poll() is None

        def stop(self, timeout: float = 30.0) -> int | None:
            from relax.engines.process import terminate

            return terminate(self.proc, timeout, group=True)

    return SGLangProcess


def launch_sglang_engines(cfg, *, base_port: int = 30000, placement_group=None, placement=None,
                          log_dir: str | None = None, health_timeout: float = 900.0):
    """Start one SGLang server per rollout replica as Ray-managed processes; returns [(actor, EngineClient)].
    `placement` (a relax.placement.Placement): engine r on bundle r of the rollout's group (in colocate mode the
    group every GPU role shares, asking the rollout's fraction of the GPU); else `placement_group`: bundle r of it,
    asking the engine's TP GPUs."""
    import ray

    tp = engine_tp_size(cfg)
    cls = _sglang_process_cls()
    engines = []
    for r in range(cfg.rollout.replicas):
        port = base_port + 2 * r
        argv = sglang_server_args(cfg, r, port=port, nccl_port=base_port + 1000 + r)
        opts: dict = {"num_gpus": tp, "num_cpus": 1}
        if placement is not None:
            opts = placement.options("rollout", r)
        elif placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=r)
        log = f"{log_dir}/sglang_{r}.log" if log_dir else None
        actor = cls.options(**opts).remote(argv, port, log)
        engines.append((actor, EngineClient(ray.get(actor.url.remote()))))
    for _, client in engines:
        client.wait_healthy(health_timeout)
    return engines


def connect_engines(urls: Iterable[str], timeout: float = 60.0) -> list["EngineClient"]:
    """Already-running engines (SGLang or our torch server) by URL; each must answer /health."""
    clients = [EngineClient(u) for u in urls]
    for c in clients:
        c.wait_healthy(timeout)
    return clients


# --- client -----------------------------------------------------------------------------------------------
def decode_routed_experts(b64: str, num_layers: int, top_k: int):
    """SGLang's meta_info.routed_experts: base64 int32, [tokens - 1, layers, top_k]."""
    import numpy as np

    arr = np.frombuffer(base64.b64decode(b64), dtype=np.int32)
    return arr.reshape(-1, num_layers, top_k)


@dataclass
class EngineClient:
    url: str
    timeout: float = 3600.0
    _http: object = field(default=None, repr=False)

    def __post_init__(self):
        import httpx

        self.url = self.url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout)

    def close(self):
        self._http.close()

    # --- plumbing -----------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, payload: dict | None = None, ok_codes=(200,)):
        import httpx

        try:
            r = self._http.request(method, path, json=payload)
        except httpx.HTTPError as e:
            raise EngineError(f"{self.url}{path}: {type(e).__name__}: {e}") from e
        if r.status_code not in ok_codes:
            try:
                body = r.json()
                msg = body.get("message") or body.get("error", {}).get("message") or r.text
            except ValueError:
                msg = r.text
            raise EngineError(f"{self.url}{path} -> HTTP {r.status_code}: {msg}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            return r.text

    def _weights(self, path: str, payload: dict) -> dict:
        res = self._call("POST", path, payload, ok_codes=(200, 400))
        if not isinstance(res, dict) or not res.get("success"):
            raise EngineError(f"{self.url}{path}: weight update failed: {res}")
        return res

    # --- health ---------------------------------------------------------------------------------------------
    def health(self) -> bool:
        try:
            return self._http.get("/health", timeout=10.0).status_code == 200
        except Exception:  # noqa: BLE001
            return False

    def health_generate(self, timeout: float = 60.0) -> bool:
        try:
            return self._http.get("/health_generate", timeout=timeout).status_code == 200
        except Exception:  # noqa: BLE001
            return False

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.health():
                return
            time.sleep(0.5)
        raise EngineError(f"{self.url}: not healthy after {timeout:.0f} s")

    def server_info(self) -> dict:
        return self._call("GET", "/get_server_info")

    def weight_version(self) -> str:
        return str(self._call("GET", "/get_weight_version")["weight_version"])

    def tp_size(self) -> int:
        return int(self.server_info().get("tp_size", 1))

    # --- generation -------------------------------------------------------------------------------------------
    def generate_raw(self, payload: dict):
        return self._call("POST", "/generate", payload)

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, temperature: float = 1.0, top_p: float = 1.0,
                 return_routed_experts: bool = False, moe_shape: tuple[int, int] | None = None) -> list[Generation]:
        """One batched /generate with output-token log-probs; routed experts decoded when `moe_shape`
        = (num_moe_layers, top_k) is given."""
        payload = {"input_ids": [list(map(int, p)) for p in prompts],
                   "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p},
                   "return_logprob": True, "return_routed_experts": return_routed_experts}
        outs = self.generate_raw(payload)
        if isinstance(outs, dict):
            outs = [outs]
        gens = []
        for o in outs:
            meta = o["meta_info"]
            toks = [int(t) for t in o.get("output_ids", [])]
            lps = [float(x[0]) for x in meta.get("output_token_logprobs", [])]
            if len(lps) != len(toks):
                raise EngineError(f"{self.url}: {len(toks)} output tokens but {len(lps)} log-probs")
            version = str(meta.get("weight_version", "-1"))
            extras = {"text": o.get("text", ""), "weight_version": version}
            if return_routed_experts and "routed_experts" in meta:
                if moe_shape is None:
                    extras["routed_experts_b64"] = meta["routed_experts"]
                else:
                    extras["routed_experts"] = decode_routed_experts(meta["routed_experts"], *moe_shape)
            fr = meta.get("finish_reason") or {}
            gens.append(Generation(toks, lps, fr.get("type", "length") if isinstance(fr, dict) else str(fr),
                                   int(version) if version.lstrip("-").isdigit() else -1, extras))
        return gens

    # --- flow control ------------------------------------------------------------------------------------------
    def pause(self, mode: str = "retract") -> None:
        self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self._call("POST", "/continue_generation", {})

    def flush_cache(self) -> bool:
        try:
            self._call("POST", "/flush_cache")
            return True
        except EngineError:
            return False  # SGLang refuses while requests are running; the weight update flushes again

    # --- weights -----------------------------------------------------------------------------------------------
    def update_weights_from_disk(self, path: str, version: int | str | None = None, flush_cache: bool = True) -> dict:
        payload = {"model_path": str(path), "flush_cache": flush_cache}
        if version is not None:
            payload["weight_version"] = str(version)
        return self._weights("/update_weights_from_disk", payload)

    def update_weights_from_safetensors(self, named: dict[str, torch.Tensor], version: int | str | None = None,
                                        flush_cache: bool = True) -> dict:
        """CPU path of /update_weights_from_tensor: the tensors travel as base64 safetensors bytes."""
        from safetensors.torch import save

        blob = save({k: v.detach().to("cpu").contiguous() for k, v in named.items()})
        payload = {"serialized_named_tensors": [base64.b64encode(blob).decode("ascii")], "load_format": "safetensors",
                   "flush_cache": flush_cache}
        if version is not None:
            payload["weight_version"] = str(version)
        return self._weights("/update_weights_from_tensor", payload)

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str = "weight_update_group", backend: str = "nccl") -> dict:
        return self._weights("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                        version: int | str | None = None, group_name: str = "weight_update_group",
                                        flush_cache: bool = True) -> dict:
        payload = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                   "flush_cache": flush_cache}
        if version is not None:
            payload["weight_version"] = str(version)
        return self._weights("/update_weights_from_distributed", payload)

    def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict:
        return self._weights("/destroy_weights_update_group", {"group_name": group_name})


# --- weight sync ------------------------------------------------------------------------------------------------
def buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into buckets of at most `bucket_bytes` (a larger tensor gets its own bucket)."""
    cur, size = [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += nbytes
    if cur:
        yield cur


class WeightSync:
    """Pushes versioned HF-named weights to rollout engines: pause -> flush -> update -> continue.

    transport: "distributed" (DCS: this process is rank 0 of a gloo / NCCL group with every engine rank and
    broadcasts bucket by bucket), "tensor" (base64 safetensors over HTTP, CPU servers), or "disk" (a
    safetensors file in `share_dir` that every engine can read)."""

    def __init__(self, clients: list[EngineClient], transport: str = "distributed", *, pause_mode: str = "retract",
                 bucket_bytes: int = 512 << 20, backend: str = "gloo", master_address: str = "127.0.0.1",
                 master_port: int | None = None, share_dir: str | None = None, device: str = "cpu",
                 group_name: str = "relax_dcs"):
        if transport not in ("distributed", "tensor", "disk"):
            raise ValueError(f"transport must be distributed, tensor or disk, not {transport!r}")
        if transport == "disk" and not share_dir:
            raise ValueError("share_dir: the disk transport needs a folder every engine can read")
        self.clients, self.transport, self.pause_mode = clients, transport, pause_mode
        self.bucket_bytes, self.backend, self.device = bucket_bytes, backend, device
        self.master_address, self.master_port = master_address, master_port
        self.share_dir, self.group_name = share_dir, group_name
        self.pg = None
        self.stats: dict = {}

    def connect(self) -> None:
        if self.transport != "distributed" or self.pg is not None:
            return
        from relax.engines.process import free_port
        from relax.weights import new_process_group

        port = self.master_port or free_port()
        sizes = [c.tp_size() for c in self.clients]
        world = 1 + sum(sizes)
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        with ThreadPoolExecutor(len(self.clients)) as ex:
            futs = [ex.submit(c.init_weights_update_group, self.master_address, port, off, world, self.group_name,
                              self.backend) for c, off in zip(self.clients, offsets)]
            self.pg = new_process_group(self.backend, self.master_address, port, 0, world)
            for f in futs:
                f.result()

    def close(self) -> None:
        if self.pg is not None:
            for c in self.clients:
                c.destroy_weights_update_group(self.group_name)
            self.pg = None

    def push(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> dict:
        """Send one weight version; `named` may be a generator (e.g. iter_megatron_to_hf) so conversion overlaps."""
        t0 = time.time()
        for c in self.clients:
            c.pause(self.pause_mode)
        try:
            for c in self.clients:
                c.flush_cache()
            t1 = time.time()
            nbytes, nbuckets = self._send(named, version)
            t2 = time.time()
        finally:
            for c in self.clients:
                c.continue_generation()
        self.stats = {"pause_s": t1 - t0, "send_s": t2 - t1, "total_s": time.time() - t0, "bytes": nbytes,
                      "buckets": nbuckets, "version": version}
        return self.stats

    def _send(self, named, version) -> tuple[int, int]:
        if self.transport == "disk":
            from safetensors.torch import save_file

            state = {k: v.detach().to("cpu").contiguous() for k, v in named}
            path = os.path.join(self.share_dir, f"weights_v{version}.safetensors")
            tmp = path + ".tmp"
            save_file(state, tmp)
            os.replace(tmp, path)
            for c in self.clients:
                c.update_weights_from_disk(path, version)
            return sum(t.numel() * t.element_size() for t in state.values()), 1
        if self.transport == "tensor":
            total, n = 0, 0
            pending = list(buckets(named, self.bucket_bytes))
            for i, bucket in enumerate(pending):
                last = i == len(pending) - 1
                for c in self.clients:
                    c.update_weights_from_safetensors(dict(bucket), version if last else None)
                total += sum(t.numel() * t.element_size() for _, t in bucket)
                n += 1
            return total, n
        self.connect()
        from relax.weights import broadcast

        total, n = 0, 0
        it = buckets(named, self.bucket_bytes)
        bucket = next(it, None)
        with ThreadPoolExecutor(max(1, len(self.clients))) as ex:
            while bucket is not None:
                nxt = next(it, None)  # look one bucket ahead: the last bucket carries the new version
                names = [k for k, _ in bucket]
                dtypes = [str(t.dtype).removeprefix("torch.") for _, t in bucket]
                shapes = [list(t.shape) for _, t in bucket]
                futs = [ex.submit(c.update_weights_from_distributed, names, dtypes, shapes,
                                  version if nxt is None else None, self.group_name) for c in self.clients]
                for _, t in bucket:
                    broadcast(self.pg, t.detach().to(self.device).contiguous(), 0)
                    total += t.numel() * t.element_size()
                for f in futs:
                    f.result()
                n += 1
                bucket = nxt
        return total, n


__all__ = ["EngineClient", "EngineError", "WeightSync", "buckets", "connect_engines", "decode_routed_experts",
           "engine_tp_size", "launch_sglang_engines", "sglang_command", "sglang_server_args"]
