"""The CPU torch engine behind the subset of SGLang's native HTTP API that Relax uses.

Routes (payloads follow SGLang's `GenerateReqInput` / `*ReqInput` structs, so `relax.engines.sglang.EngineClient`
drives this server and a real `sglang.launch_server` the same way):

| route | what it does here |
|---|---|
| `POST /generate` | `input_ids` or `text` (one prompt or a batch), `sampling_params` {max_new_tokens, temperature, top_p}, `return_logprob` -> `meta_info.output_token_logprobs` [[logprob, token_id, null], ...], `return_routed_experts` (MoE) -> `meta_info.routed_experts` (base64 int32 [prompt+completion-1, layers, top_k], as SGLang) |
| `POST /pause_generation` | {"mode": "abort" / "in_place" / "retract"}: abort ends in-flight requests now (finish_reason abort); in_place and retract park them at the next decode step (this engine has no KV pool to retract, so retract = in_place); new requests wait until continue |
| `POST /continue_generation` | resumes |
| `GET/POST /flush_cache` | no cross-request cache here: always succeeds |
| `POST /update_weights_from_disk` | {"model_path": HF folder or .safetensors file, "weight_version"}: the CPU weight path |
| `POST /update_weights_from_tensor` | {"serialized_named_tensors": [base64 safetensors bytes], "load_format": "safetensors"} (SGLang's own payload is a CUDA-IPC pickle that only a GPU SGLang server reads) |
| `POST /init_weights_update_group`, `/update_weights_from_distributed`, `/destroy_weights_update_group` | DCS broadcast: the trainer is rank 0 of a standalone gloo (CPU) or NCCL group and broadcasts each named tensor |
| `GET /health`, `GET /health_generate` | liveness; one greedy token |
| `GET /get_model_info`, `/get_weight_version`, `/get_server_info` | model path, weight version, engine facts |

Concurrent requests are batched continuously, as SGLang's scheduler does: one batcher thread runs the engine's
continuous batching (relax/engines/continuous.py) over every request waiting, at most `--max-running-requests`
sequences at once, each sampled with its own settings; a request joins at the next decode step and replies when
its last sequence ends. (`return_routed_experts` requests run alone, after the batch drains: the capture hooks
record whole forwards.)

Weights are always named as in a Hugging Face checkpoint (per-expert MoE names). Updates copy in place between
decode steps: a forward pre/post hook pair holds a lock for each model forward, so an update never overlaps a
forward even while a request is in flight.

Run: `python -m relax.engines.http_server --model '{"kind": "tiny_qwen3"}' --port 30000`; `launch_torch_server`
starts it as a child process that `ServerProcess.stop()` ends by PID.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from relax.engines.process import free_port, terminate
from relax.engines.torch_engine import Generation, TorchEngine
from relax.weights import broadcast, new_process_group


class _Aborted(Exception):
    pass


class Req(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingParams(Req):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # Accepted only at their neutral values (this engine has no such samplers).
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1


_NEUTRAL = {"top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
            "ignore_eos": False, "stop": None, "stop_token_ids": None, "n": 1}


class GenerateReq(Req):
    rid: str | list[str] | None = None
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False
    return_routed_experts: bool = False
    stream: bool = False


class PauseReq(Req):
    mode: Literal["abort", "in_place", "retract"] = "abort"
    rid: str | None = None


class WeightsCommon(Req):
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    load_format: str | None = None
    torch_empty_cache: bool = False
    rid: str | None = None


class DiskWeightsReq(WeightsCommon):
    model_path: str
    is_async: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0


class TensorWeightsReq(WeightsCommon):
    serialized_named_tensors: list[str]
    disable_draft_model: bool | None = None


class InitGroupReq(Req):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"
    rid: str | None = None


class DistWeightsReq(WeightsCommon):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"


class DestroyGroupReq(Req):
    group_name: str = "weight_update_group"
    rid: str | None = None


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


@dataclass
class _Job:
    """One sequence of a /generate request, waiting for the batcher or in its batch."""

    prompt: list[int]
    limit: int
    sampling: tuple[float, float]  # (temperature, top_p)
    done: threading.Event = field(default_factory=threading.Event)
    gen: Generation | None = None  # None once done: aborted
    error: Exception | None = None


class EngineServer:
    """State behind the routes: one TorchEngine, the batcher, pause state, forward lock, weight-update groups."""

    def __init__(self, engine: TorchEngine, model_path: str = "", device: str = "cpu", max_running: int = 64):
        self.engine = engine
        self.tok = engine.tokenizer
        self.model_path = model_path
        self.device = device
        self.max_running = max_running
        self.weight_version = str(engine.version)
        self._gen_lock = threading.Lock()  # held by whoever drives the engine: the batcher or a routed-experts call
        self._waiting: deque[_Job] = deque()  # jobs no batch has taken yet
        self._work = threading.Condition()  # guards _waiting; notified when a job arrives
        threading.Thread(target=self._batcher, name="batcher", daemon=True).start()
        self._fwd = threading.Lock()  # held during each model forward; weight copies take it between steps
        self._held = threading.local()
        self._accepting = threading.Event()
        self._accepting.set()
        self._abort = False
        self.groups: dict[str, Any] = {}
        self.forwards = 0  # model forward calls so far (one per decode step): observable progress
        self._capture: list | None = None
        model = engine.model
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post, always_call=True)
        self.moe_gates = [layer.mlp.gate for layer in getattr(getattr(model, "model", model), "layers", [])
                          if hasattr(layer.mlp, "experts") and hasattr(layer.mlp, "gate")]
        for i, gate in enumerate(self.moe_gates):
            gate.register_forward_hook(self._route_hook(i))
        self.top_k = getattr(model.config, "num_experts_per_tok", 0) if self.moe_gates else 0

    # --- hooks ---------------------------------------------------------------------------------------
    def _pre(self, module, args):
        if self._abort:
            raise _Aborted()
        self._fwd.acquire()
        self._held.v = True
        self.forwards += 1
        if self._capture is not None:
            self._capture.append([None] * len(self.moe_gates))

    def _post(self, module, args, output):
        if getattr(self._held, "v", False):
            self._held.v = False
            self._fwd.release()

    def _route_hook(self, i):
        def hook(module, args, output):
            if self._capture is not None and self._capture:
                self._capture[-1][i] = output[2].detach().to(torch.int32).cpu()  # (logits, scores, indices)
        return hook

    # --- generation ----------------------------------------------------------------------------------
    def generate(self, req: GenerateReq) -> list[dict] | dict:
        if req.stream:
            raise ValueError("stream: streaming is not supported by the torch engine server")
        if req.logprob_start_len not in (None, -1):
            raise ValueError("logprob_start_len: only output-token log-probs (-1) are supported")
        if req.top_logprobs_num not in (None, 0):
            raise ValueError("top_logprobs_num: top log-probs are not supported")
        if req.return_routed_experts and not self.moe_gates:
            raise ValueError("return_routed_experts: the model has no MoE layers")
        single = False
        if req.input_ids is not None:
            prompts = req.input_ids
            if prompts and isinstance(prompts[0], int):
                prompts, single = [prompts], True
        elif req.text is not None:
            texts = [req.text] if isinstance(req.text, str) else req.text
            single = isinstance(req.text, str)
            prompts = [self.tok.encode(t) for t in texts]
        else:
            raise ValueError("input_ids: one of text or input_ids is required")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("input_ids: empty prompt")
        sp = req.sampling_params or SamplingParams()
        if isinstance(sp, list):
            if any(s != sp[0] for s in sp):
                raise ValueError("sampling_params: a batch must share one set of sampling params here")
            sp = sp[0]
        for key, neutral in _NEUTRAL.items():
            if getattr(sp, key) != neutral:
                raise ValueError(f"sampling_params.{key}: not supported by the torch engine (use {neutral!r})")
        vocab = self.engine.model.config.vocab_size
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise ValueError(f"input_ids: token ids must be in [0, {vocab})")
        rids = req.rid if isinstance(req.rid, list) else [req.rid or uuid.uuid4().hex] * len(prompts)
        if len(rids) != len(prompts):
            raise ValueError("rid: one id per prompt")

        capture = None
        if req.return_routed_experts:
            gens, capture = self._generate_alone(prompts, sp)
        else:
            gens = self._generate_batched(prompts, sp)
        out = []
        for i, p in enumerate(prompts):
            if gens[i] is None:
                meta = {"id": rids[i], "finish_reason": {"type": "abort", "message": "aborted by pause_generation"},
                        "prompt_tokens": len(p), "completion_tokens": 0, "cached_tokens": 0,
                        "weight_version": self.weight_version}
                if req.return_logprob:
                    meta["output_token_logprobs"] = []
                out.append({"text": "", "output_ids": [], "meta_info": meta})
                continue
            g = gens[i]
            if g.finish_reason == "stop":
                fr = {"type": "stop", "matched": self.tok.eos_token_id}
            else:
                fr = {"type": "length", "length": sp.max_new_tokens}
            meta = {"id": rids[i], "finish_reason": fr, "prompt_tokens": len(p), "completion_tokens": len(g.token_ids),
                    "cached_tokens": 0, "weight_version": str(g.weight_version)}
            if req.return_logprob:
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(g.log_probs, g.token_ids)]
            if req.return_routed_experts:
                meta["routed_experts"] = self._routes(capture, i, len(prompts), len(p), max(len(x) for x in prompts),
                                                      len(g.token_ids))
            out.append({"text": self.tok.decode(g.token_ids), "output_ids": g.token_ids, "meta_info": meta})
        return out[0] if single else out

    def _generate_batched(self, prompts: list[list[int]], sp: SamplingParams) -> list[Generation | None]:
        """Hand each prompt to the batcher and wait for all of them (None: aborted)."""
        self._accepting.wait()  # a paused server takes no new work (SGLang's pause_generation)
        jobs = [_Job(p, sp.max_new_tokens, (sp.temperature, sp.top_p)) for p in prompts]
        with self._work:
            self._waiting.extend(jobs)
            self._work.notify()
        for job in jobs:
            job.done.wait()
        for job in jobs:
            if job.error is not None:
                raise RuntimeError(f"generation failed: {job.error}") from job.error
        return [job.gen for job in jobs]

    def _batcher(self) -> None:
        """Drive the engine's continuous batching over whatever is waiting, for as long as anything is."""
        while True:
            with self._work:
                while not self._waiting:
                    self._work.wait()
            with self._gen_lock:
                started: list[_Job] = []

                def feed(free: int) -> list[tuple[list[int], int]]:
                    with self._work:
                        new = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                    started.extend(new)
                    return [(j.prompt, j.limit) for j in new]

                try:
                    for i, gen in self.engine.generate_stream(feed, self.max_running,
                                                              sampling=lambda i: started[i].sampling):
                        started[i].gen = gen
                        started[i].done.set()
                except _Aborted:
                    self._end(started)
                except Exception as e:  # noqa: BLE001 - every waiting caller gets the engine's error, none hangs
                    self._end(started, e)

    def _end(self, jobs: list[_Job], error: Exception | None = None) -> None:
        """Every job not yet done ends now: aborted (gen None) or failed with `error`."""
        for job in jobs:
            if not job.done.is_set():
                job.error = error
                job.done.set()

    def _generate_alone(self, prompts: list[list[int]], sp: SamplingParams):
        """One chunked generate with the engine to itself (the routing capture records whole forwards)."""
        while True:  # never hold the generate lock while paused (pause(abort) takes it)
            self._accepting.wait()
            self._gen_lock.acquire()
            if self._accepting.is_set():
                break
            self._gen_lock.release()
        try:
            eng = self.engine
            eng.temperature, eng.top_p = sp.temperature, sp.top_p
            self._capture = []
            try:
                gens = eng.generate(prompts, sp.max_new_tokens)
            except _Aborted:
                gens = [None] * len(prompts)
            finally:
                capture, self._capture = self._capture, None
        finally:
            self._gen_lock.release()
        return gens, capture

    def _routes(self, capture, row, batch, n_prompt, width, n_out) -> str:
        """Experts chosen for each token fed to the model: prompt tokens, then all generated tokens but the last."""
        steps = []
        prefill = torch.stack(capture[0], dim=1).reshape(batch, width, len(self.moe_gates), self.top_k)
        steps.append(prefill[row, width - n_prompt:])
        for call in capture[1:n_out]:
            steps.append(torch.stack(call, dim=1).reshape(batch, 1, len(self.moe_gates), self.top_k)[row])
        arr = torch.cat(steps).contiguous().numpy()
        return base64.b64encode(arr.tobytes()).decode("ascii")

    # --- flow control ----------------------------------------------------------------------------------
    def pause(self, mode: str) -> None:
        self._accepting.clear()
        if mode == "abort":
            self._abort = True
            self.engine.resume()  # a request parked by an earlier in_place pause must reach the abort
            # Wait for an in-flight request to hit the abort, then let later forwards (health checks) run again.
            with self._gen_lock:
                self._abort = False
                with self._work:  # requests no batch has started are aborted too, as SGLang's abort does
                    waiting, self._waiting = list(self._waiting), deque()
                self._end(waiting)
        else:
            self.engine.pause()

    def resume(self) -> None:
        self._abort = False
        self.engine.resume()
        self._accepting.set()

    @property
    def paused(self) -> bool:
        return not self._accepting.is_set()

    # --- weights ----------------------------------------------------------------------------------------
    def load(self, named: dict[str, torch.Tensor], version: str | None) -> int:
        from relax.trainers.megatron.convert import copy_hf_into_model

        if self.engine.asleep:
            raise RuntimeError("engine is asleep")
        with self._fwd:
            n = copy_hf_into_model(self.engine.model, named)
            if version is not None:
                self.weight_version = version
                self.engine.version = int(version) if version.lstrip("-").isdigit() else self.engine.version + 1
        return n

    def init_group(self, req: InitGroupReq) -> None:
        if req.group_name in self.groups:
            raise ValueError(f"group_name: {req.group_name!r} already exists")
        backend = "gloo" if self.device == "cpu" and req.backend == "nccl" else req.backend
        self.groups[req.group_name] = new_process_group(backend, req.master_address, req.master_port, req.rank_offset,
                                                        req.world_size)

    def receive(self, req: DistWeightsReq) -> dict[str, torch.Tensor]:
        pg = self.groups.get(req.group_name)
        if pg is None:
            raise ValueError(f"group_name: no weight update group {req.group_name!r}; call /init_weights_update_group")
        if not len(req.names) == len(req.dtypes) == len(req.shapes):
            raise ValueError("names: names, dtypes and shapes must have the same length")
        named = {}
        for name, dt, shape in zip(req.names, req.dtypes, req.shapes):
            t = torch.empty(shape, dtype=_dtype(dt), device=self.device)
            broadcast(pg, t, 0)
            named[name] = t
        return named


def create_app(server: EngineServer):
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="Relax torch engine (SGLang-compatible subset)")
    app.state.server = server

    def err(msg: str, code: int = 400):
        return JSONResponse({"object": "error", "message": msg, "type": "BadRequest", "code": code}, status_code=code)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError):
        msgs = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors()]
        return err("; ".join(msgs))

    @app.get("/health")
    def health():
        return Response(status_code=200)

    @app.get("/health_generate")
    def health_generate():
        if server.paused:
            return Response(status_code=200)
        try:
            server.generate(GenerateReq(input_ids=[server.tok.eos_token_id],
                                        sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0)))
        except Exception:  # noqa: BLE001 - any failure means unhealthy
            return Response(status_code=503)
        return Response(status_code=200)

    @app.api_route("/generate", methods=["POST", "PUT"])
    def generate(req: GenerateReq):
        try:
            return server.generate(req)
        except ValueError as e:
            return err(str(e))
        except RuntimeError as e:
            return err(str(e), 503)

    @app.post("/pause_generation")
    def pause(req: PauseReq | None = None):
        server.pause((req or PauseReq()).mode)
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    def continue_generation():
        server.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    def flush_cache():
        return Response(content="Cache flushed.\n", status_code=200)

    def _weights_reply(fn, req: WeightsCommon):
        if req.abort_all_requests:
            return err("abort_all_requests: not supported; call /pause_generation with mode 'abort' first")
        try:
            named = fn()
            n = server.load(named, req.weight_version)
        except (KeyError, ValueError, OSError) as e:
            return JSONResponse({"success": False, "message": str(e).strip('"')}, status_code=400)
        msg = f"Updated {n} tensors."
        if req.weight_version is not None:
            msg += f" Weight version updated to {req.weight_version}."
        return {"success": True, "message": msg, "num_paused_requests": 0}

    @app.post("/update_weights_from_disk")
    def update_from_disk(req: DiskWeightsReq):
        def read():
            from safetensors.torch import load_file

            path = Path(req.model_path)
            files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
            if not files or not all(f.is_file() for f in files):
                raise OSError(f"model_path: no safetensors weights at {req.model_path}")
            named = {}
            for f in files:
                named.update(load_file(str(f)))
            return named
        return _weights_reply(read, req)

    @app.post("/update_weights_from_tensor")
    def update_from_tensor(req: TensorWeightsReq):
        if req.load_format != "safetensors":
            return err("load_format: this torch engine server reads base64 safetensors bytes (load_format="
                       "'safetensors'); SGLang's serialized CUDA tensors need a GPU SGLang server")

        def read():
            from safetensors.torch import load

            named = {}
            for blob in req.serialized_named_tensors:
                named.update(load(base64.b64decode(blob)))
            return named
        return _weights_reply(read, req)

    @app.post("/init_weights_update_group")
    def init_group(req: InitGroupReq):
        try:
            server.init_group(req)
        except Exception as e:  # noqa: BLE001 - rendezvous errors go back to the caller
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    @app.post("/update_weights_from_distributed")
    def update_from_distributed(req: DistWeightsReq):
        return _weights_reply(lambda: server.receive(req), req)

    @app.post("/destroy_weights_update_group")
    def destroy_group(req: DestroyGroupReq):
        if server.groups.pop(req.group_name, None) is None:
            return JSONResponse({"success": False, "message": f"no group {req.group_name!r}"}, status_code=400)
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    @app.get("/get_model_info")
    def model_info():
        return {"model_path": server.model_path, "tokenizer_path": server.model_path, "is_generation": True,
                "weight_version": server.weight_version}

    @app.get("/get_weight_version")
    def weight_version():
        return {"weight_version": server.weight_version}

    @app.get("/get_server_info")
    def server_info():
        cfg = server.engine.model.config
        return {"engine": "torch", "tp_size": 1, "model_path": server.model_path, "weight_version": server.weight_version,
                "num_hidden_layers": cfg.num_hidden_layers, "num_moe_layers": len(server.moe_gates),
                "num_experts_per_tok": server.top_k, "paused": server.paused, "dtype": str(server.engine.dtype),
                "forwards": server.forwards}

    return app


# --- process management ----------------------------------------------------------------------------------
@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout` (a paused in-flight request would hold a graceful shutdown)."""
        return terminate(self.proc, timeout)


def wait_healthy(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"engine server exited with code {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"engine server at {url} not healthy after {timeout:.0f} s")


def launch_torch_server(model: dict, *, port: int | None = None, host: str = "127.0.0.1", seed: int = 0,
                        dtype: str = "float32", weights: str | None = None, threads: int = 1,
                        max_running: int = 64, log_path: str | None = None, timeout: float = 120.0) -> ServerProcess:
    """Start `python -m relax.engines.http_server` as a child process and wait until /health answers."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "relax.engines.http_server", "--model", json.dumps(model), "--host", host,
           "--port", str(port), "--seed", str(seed), "--dtype", dtype, "--threads", str(threads),
           "--max-running-requests", str(max_running)]
    if weights:
        cmd += ["--weights", weights]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log_path else subprocess.DEVNULL)
    server = ServerProcess(proc, f"http://{host}:{port}")
    try:
        wait_healthy(server.url, timeout, proc)
    except BaseException:
        server.stop(2.0)
        raise
    return server


def build_server(model: dict, *, seed: int = 0, dtype: str = "float32", weights: str | None = None,
                 device: str = "cpu", max_running: int = 64) -> EngineServer:
    from relax.config import ModelConfig
    from relax.models import build_model

    mcfg = ModelConfig.model_validate(model)
    hf_model, tok = build_model(mcfg, seed)
    engine = TorchEngine(hf_model, tok, dtype=dtype, seed=seed)  # the torch engine runs on CPU
    server = EngineServer(engine, model_path=mcfg.path or mcfg.kind, device=device, max_running=max_running)
    if weights:
        from safetensors.torch import load_file

        server.load(load_file(weights), None)
    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Relax torch engine behind SGLang's HTTP API subset")
    p.add_argument("--model", required=True, help='ModelConfig as JSON, e.g. \'{"kind": "tiny_qwen3"}\'')
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--weights", help="safetensors file (HF names) loaded at start")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="where DCS broadcast buffers live (cuda for NCCL groups)")
    p.add_argument("--max-running-requests", type=int, default=64, help="sequences decoding at once (SGLang's name)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import uvicorn

    server = build_server(json.loads(args.model), seed=args.seed, dtype=args.dtype, weights=args.weights,
                          device=args.device, max_running=args.max_running_requests)
    uvicorn.run(create_app(server), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
