"""GPU checks (`pytest -m gpu`, run by scripts/gpu_check.sh): the Megatron trainer step on a tiny Qwen3, the
single-GPU weight update path (CUDA tensors -> HF names -> our engine server), and SGLang on the GPU when
installed. All skip cleanly without CUDA."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from relax.config import ModelConfig, load_config
from relax.models import build_model
from relax.trainers import compute_log_probs
from relax.trainers.megatron import copy_hf_into_model, hf_state_from_model  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, num_experts=4,
            experts_per_token=2)
needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang not installed")


def _cfg(**over):
    ov = [f"model.{k}={v}" for k, v in TINY.items()] + [f"{k}={v}" for k, v in over.items()]
    return load_config("experiments/async/cpu.yaml", ov)


@pytest.fixture(autouse=True)
def _exact_matmuls():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield


def test_cuda_weights_load_into_a_cpu_model_through_hf_names():
    model, _ = build_model(ModelConfig(kind="tiny_qwen3_moe", **TINY), seed=1)
    other, _ = build_model(ModelConfig(kind="tiny_qwen3_moe", **TINY), seed=2)
    named = {k: v.cuda() for k, v in hf_state_from_model(other).items()}
    from relax.trainers.megatron.convert import copy_hf_into_model as copy

    assert copy(model, named) == len(named)
    ids = torch.randint(3, 90, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, other(ids).logits)


_TRAINER = r"""
import json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = False
from relax.config import ModelConfig, load_config
from relax.algorithms import LossScale
from relax.engines.http_server import launch_torch_server
from relax.engines.sglang import EngineClient
from relax.models import build_model
from relax.trainers import compute_log_probs
from relax.trainers.megatron import hf_state_from_model
from relax.trainers.megatron.trainer import MegatronTrainer

kind, tiny = sys.argv[1], json.loads(sys.argv[2])
cfg = load_config("experiments/async/cpu.yaml", [f"model.{k}={v}" for k, v in tiny.items()] + [f"model.kind={kind}"])
hf, tok = build_model(cfg.model, 0)
tr = MegatronTrainer(hf.config, hf_state_from_model(hf), tok.pad_token_id, cfg)
prompts = [torch.tensor(tok.encode("What is 3 + 4? Answer:")), torch.tensor(tok.encode("12-5="))]
responses = [torch.randint(3, 90, (7,)), torch.randint(3, 90, (4,))]
T = cfg.rollout.temperature
ours = tr.log_probs(prompts, responses, 4096)
ref = compute_log_probs(hf, tok.pad_token_id, prompts, responses, T, 4096)
err0 = max(float((a - b).abs().max()) for a, b in zip(ours, ref))
mb = {"prompt_ids": prompts, "response_ids": responses, "old_log_probs": [r.clone() for r in ours],
      "rollout_log_probs": [r.clone() for r in ours], "advantages": [torch.ones(len(responses[0])), -torch.ones(len(responses[1]))]}
scale = LossScale(total_tokens=sum(len(r) for r in responses), total_seqs=2)
losses = []
for _ in range(3):
    m = tr.accumulate(mb, scale)
    st = tr.step()
    losses.append(m["loss"])
after = tr.log_probs(prompts, responses, 4096)
moved = [float((a - b).sum()) for a, b in zip(after, ours)]
# weight update path: trainer (CUDA) -> HF names -> torch engine server -> engine log-probs == trainer log-probs
state = tr.hf_state(device="cuda")
srv = launch_torch_server(cfg.model.model_dump(), seed=0)
try:
    c = EngineClient(srv.url)
    c.update_weights_from_safetensors(state, version=3)
    gens = c.generate([p.tolist() for p in prompts], 6, temperature=T)
    trained = tr.log_probs(prompts, [torch.tensor(g.token_ids) for g in gens], 4096)
    err_engine = max(float((a - torch.tensor(g.log_probs)).abs().max()) for a, g in zip(trained, gens))
    versions = [g.weight_version for g in gens]
finally:
    srv.stop()
print(json.dumps({"err0": err0, "losses": losses, "moved": moved, "grad_norm": st["grad_norm"],
                  "err_engine": err_engine, "versions": versions}))
"""


@needs_megatron
@pytest.mark.parametrize("kind", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_megatron_trainer_step_and_weight_update_path(kind, tmp_path):
    """GPTModel from the Qwen3 config: same log-probs as HF, a GRPO step moves them the right way, and its
    weights (CUDA -> HF names) load into our engine server, which then reproduces the trainer's log-probs."""
    env = dict(os.environ, MASTER_PORT=str(29600 + (kind == "tiny_qwen3_moe")))
    out = subprocess.run([sys.executable, "-c", _TRAINER, kind, json.dumps(TINY)], capture_output=True, text=True,
                         timeout=420, env=env, cwd=os.getcwd())
    assert out.returncode == 0, out.stderr[-4000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["err0"] < 2e-3, res
    assert res["moved"][0] > 0 > res["moved"][1], res  # advantage +1 raises, -1 lowers the response's log-prob
    assert res["grad_norm"] > 0 and all(v == 3 for v in res["versions"])
    assert res["err_engine"] < 2e-3, res


@needs_sglang
def test_sglang_engine_generates_and_updates_weights_on_gpu(tmp_path):
    """A real sglang.launch_server on the tiny exported model, driven by our client."""
    from relax.engines.process import free_port
    from relax.engines.sglang import EngineClient
    from relax.export import export_run, save_final_weights
    from relax.config import dump_config
    from relax.models import state_dict_cpu

    cfg = _cfg(**{"model.kind": "tiny_qwen3"})
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    model, tok = build_model(cfg.model, cfg.seed)
    save_final_weights(run, state_dict_cpu(model))
    export_run(run, tmp_path / "hf")
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tmp_path / "hf"), "--port", str(port),
           "--host", "127.0.0.1", "--tp-size", "1", "--dtype", "float32", "--mem-fraction-static", "0.2",
           "--skip-server-warmup", "--weight-version", "0", "--disable-cuda-graph"]
    log = open(tmp_path / "sglang.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        c = EngineClient(f"http://127.0.0.1:{port}")
        c.wait_healthy(300)
        prompts = [tok.encode("What is 3 + 4? Answer:"), tok.encode("12-5=")]
        gens = c.generate(prompts, 8, temperature=1.0)
        ref = compute_log_probs(model, tok.pad_token_id, [torch.tensor(p) for p in prompts],
                                [torch.tensor(g.token_ids) for g in gens], 1.0, 4096)
        for r, g in zip(ref, gens):
            assert len(g.log_probs) == len(g.token_ids) > 0
            assert float((r - torch.tensor(g.log_probs)).abs().max()) < 5e-2
        c.pause("retract")
        c.flush_cache()
        res = c.update_weights_from_disk(str(tmp_path / "hf"), version=1)
        c.continue_generation()
        assert res["success"] and c.weight_version() == "1"
        assert c.health_generate()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py not installed")
def test_nvml_reports_the_gpu_and_a_process_holding_memory_on_it():
    from relax.metrics.gpu import device_metrics, process_metrics, reset

    reset()
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 256 MiB held by this process
    m = device_metrics()
    assert m["device"] == "gpu" and m["gpu_count"] == torch.cuda.device_count(), m
    g = m["gpus"][0]
    assert g["mem_total_mb"] > 1000 and 0 <= g["util_pct"] <= 100 and g["mem_used_mb"] >= 256, g
    p = process_metrics()
    # per device; empty when NVML's pids are another namespace's (containers), else at least our 256 MiB
    assert isinstance(p["gpu_mem_mb"], dict) and (not p["gpu_mem_mb"] or sum(p["gpu_mem_mb"].values()) >= 256), p
    del x
