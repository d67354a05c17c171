"""The Megatron-Core trainer executed on the CPU (megatron-core's CUDA calls emulated by cpu_shim, gloo process
group, world size 1): the same GPTModel, DDP, optimizer and pipeline schedule code as on a GPU, checked against
the torch trainer from the same Hugging Face weights. Skipped when megatron-core is not importable or a GPU is
present (tests/trainers/test_megatron_convert_gpu.py runs the real thing there)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU emulation test (the GPU tests cover CUDA)"),
]

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, num_experts=4,
            experts_per_token=2)

_SCRIPT = r"""
import copy, json, sys, warnings
warnings.filterwarnings("ignore")
import logging; logging.disable(logging.WARNING)
import torch
from relax.algorithms import LossScale
from relax.config import load_config
from relax.models import build_model
from relax.trainers import TorchTrainer, compute_log_probs
from relax.trainers.factory import build_megatron_trainer
from relax.trainers.megatron import cpu_shim
from relax.trainers.megatron.trainer import MegatronTrainer

tiny = json.loads(sys.argv[1])
out = {}
for kind in ("tiny_qwen3", "tiny_qwen3_moe"):
    cfg = load_config("experiments/async/cpu.yaml", [f"model.{k}={v}" for k, v in tiny.items()] + [
        f"model.kind={kind}", "training.trainer=megatron", "training.lr=1e-3", "training.grad_clip=100"])
    hf, tok = build_model(cfg.model, 0)
    pad = tok.pad_token_id
    ref = TorchTrainer(copy.deepcopy(hf), pad, cfg)
    mg = build_megatron_trainer(cfg, hf, pad)  # loads hf's weights (HF -> Megatron conversion)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.tensor(tok.encode(s)) for s in ("What is 3 + 4? Answer:", "12-5=", "7*6 is")]
    responses = [torch.randint(3, 90, (n,), generator=g) for n in (7, 4, 9)]
    T = cfg.rollout.temperature
    diff = lambda a, b: max(float((x - y).abs().max()) for x, y in zip(a, b))
    lp_mg, lp_ref = mg.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
    noise = [0.05 * torch.randn(len(r), generator=g) for r in responses]  # ratios != 1: the clip path is used
    mb = {"prompt_ids": prompts, "response_ids": responses,
          "old_log_probs": [a + n for a, n in zip(lp_ref, noise)],
          "advantages": [torch.full((len(r),), a) for r, a in zip(responses, (1.0, -1.0, 0.5))]}
    tokens = sum(len(r) for r in responses)
    unit = LossScale(total_tokens=1, total_seqs=1)
    metrics = {}
    for name, tr in (("mg", mg), ("ref", ref)):  # the Actor's accumulate -> divide -> step sequence
        m = tr.accumulate(mb, unit)
        tr.divide_grads(tokens)
        metrics[name] = {**m, **tr.step()}
    after_mg, after_ref = mg.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
    # A non-finite step (NaN loss denominator, so NaN loss and gradients): skipped, nothing changes.
    flat = lambda o: ([t for v in o.values() for t in flat(v)] if isinstance(o, dict) else
                      [t for v in o for t in flat(v)] if isinstance(o, (list, tuple)) else
                      [o.clone()] if isinstance(o, torch.Tensor) else [o])
    nan = {}
    for name, tr, lp in (("mg", mg, after_mg), ("ref", ref, after_ref)):
        opt_before = flat(tr.optimizer_state())
        m = tr.accumulate(mb, unit)
        tr.divide_grads(float("nan"))
        st = tr.step()
        opt_after = flat(tr.optimizer_state())
        same_opt = len(opt_before) == len(opt_after) and all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(opt_before, opt_after))
        nan[name] = {"skipped": st["skipped_nonfinite"], "grad_norm_finite": st["grad_norm"] == st["grad_norm"],
                     "moved": diff(tr.log_probs(prompts, responses, 4096), lp), "same_opt": same_opt}
    after_mg, after_ref = mg.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
    mirror = copy.deepcopy(hf)
    copied = mg.sync_hf(mirror)
    lp_mirror = compute_log_probs(mirror, pad, prompts, responses, T, 4096)
    out[kind] = {"err_before": diff(lp_mg, lp_ref), "err_after": diff(after_mg, after_ref),
                 "moved": diff(after_ref, lp_ref), "err_mirror": diff(lp_mirror, after_mg), "copied": copied,
                 "n_params": len(dict(mirror.named_parameters())),
                 "loss": [metrics["mg"]["loss"], metrics["ref"]["loss"]],
                 "grad_norm": [metrics["mg"]["grad_norm"], metrics["ref"]["grad_norm"]],
                 "shim": cpu_shim.enabled(), "nan": nan}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def result():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("MASTER_PORT", None)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(TINY)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_megatron_step_matches_the_torch_trainer(result, kind):
    r = result[kind]
    assert r["shim"]
    # Same HF weights through convert.py into a GPTModel: the same per-token log-probs as transformers.
    assert r["err_before"] < 1e-5, r
    # Same loss and the same gradient (norm before clipping): loss scaling, masks and the per-token field
    # placement agree with the torch trainer.
    assert abs(r["loss"][0] - r["loss"][1]) < 1e-5, r
    assert abs(r["grad_norm"][0] - r["grad_norm"][1]) < 1e-4 * r["grad_norm"][1], r
    # One Adam step moves the log-probs by far more than the two trainers disagree.
    assert r["moved"] > 0.1 and r["err_after"] < 1e-4, r
    # The trained shards come back to HF names and into a transformers model (what DCS publishes) exactly.
    assert r["copied"] >= r["n_params"] - 1 and r["err_mirror"] < 1e-5, r


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tiny_qwen3", "tiny_qwen3_moe"])
@pytest.mark.parametrize("trainer", ["mg", "ref"])
def test_a_non_finite_step_is_skipped_and_changes_nothing(result, kind, trainer):
    """NaN loss and gradients (the Actor's `nan` fault divides by a NaN denominator): the Megatron and the torch
    trainer both skip the update; weights (log-probs) and optimizer state are exactly as before."""
    r = result[kind]["nan"][trainer]
    assert r["skipped"] == 1 and not r["grad_norm_finite"], r
    assert r["moved"] == 0 and r["same_opt"], r


@pytest.mark.slow
def test_actor_role_trains_with_megatron_end_to_end(single):
    """training.trainer=megatron: the Actor (a Ray actor process) builds the Megatron trainer on the CPU, trains
    from the bus and publishes the trained weights through DCS every step, like the torch trainer. The 2-step run
    is test_megatron_group_cpu.py's one-rank reference (tests/trainers/conftest.py)."""
    cfg, summary, rows, _ = single
    assert cfg.training.trainer == "megatron" and summary["backends"]["actor"].startswith("megatron (1 rank(s)")
    assert [r["step"] for r in rows] == [0, 1] and [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["samples"] == 16 and r["grad_norm"] > 0 and r["update_ok"] for r in rows), rows
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine present")
def test_sequence_parallel_without_transformer_engine_is_refused_clearly():
    from relax.config import load_config
    from relax.models import build_model
    from relax.trainers.megatron.convert import Parallel
    from relax.trainers.megatron.trainer import MegatronTrainer

    cfg = load_config("experiments/async/cpu.yaml", [f"model.{k}={v}" for k, v in TINY.items()])
    hf, tok = build_model(cfg.model, 0)
    with pytest.raises(ValueError, match="sequence_parallel needs Transformer Engine"):
        MegatronTrainer(hf.config, None, tok.pad_token_id, cfg, parallel=Parallel(tp=2), sequence_parallel=True)
