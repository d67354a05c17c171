"""GPU checks of the Megatron worker group (`pytest -m gpu`, run by scripts/gpu_check.sh; skipped without CUDA).
One GPU holds one rank (NCCL refuses two ranks on one device), so these run the group code at world size 1:
`resources.actor.workers=1` builds a MegatronGroup of one on NCCL (dispatch, data-parallel split, metrics, the
shard gather and the optimizer state wrapper), checked against the torch trainer; with the whole project
environment installed (Ray, TransferQueue, reasoning-gym), a `relax run` whose Actor is placed on the GPU through
its placement group. The multi-rank dispatch itself is checked on the CPU (tests/test_megatron_group_cpu.py)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")]
TINY = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", "model.num_heads=4",
        "model.num_kv_heads=2"]

_GROUP = r"""
import copy, json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = False
from relax.algorithms import LossScale
from relax.config import load_config
from relax.models import build_model
from relax.trainers import TorchTrainer, compute_log_probs
from relax.trainers.megatron.group import MegatronGroup
from relax.trainers.megatron.probe import probe_batch, probe_micro_batch
from relax.trainers.megatron.trainer import build_megatron_trainer

cfg = load_config("experiments/async/cpu.yaml", json.loads(sys.argv[1]))
hf, tok = build_model(cfg.model, 0)
pad = tok.pad_token_id
ref = TorchTrainer(copy.deepcopy(hf), pad, cfg)
g = build_megatron_trainer(cfg, copy.deepcopy(hf), pad)
prompts, responses = probe_batch(tok)
lp_g, lp_ref = g.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
mb = probe_micro_batch(prompts, responses, lp_ref)
out = {}
for key, tr in (("group", g), ("ref", ref)):
    m = tr.accumulate(mb, LossScale(total_tokens=1, total_seqs=1))
    tr.divide_grads(20)
    out[key] = {**m, **tr.step()}
after_g, after_ref = g.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
mirror = copy.deepcopy(hf)
g.sync_hf(mirror)
diff = lambda a, b: max(float((x.cpu() - y.cpu()).abs().max()) for x, y in zip(a, b))
state = g.optimizer_state()
g.load_optimizer_state(state)
try:
    g.load_optimizer_state({**state, "world": 2})
    refused = False
except ValueError:
    refused = True
print(json.dumps({"is_group": isinstance(g, MegatronGroup), "ranks": out["group"].get("trainer_ranks"),
                  "err_before": diff(lp_g, lp_ref), "err_after": diff(after_g, after_ref),
                  "moved": diff(after_ref, lp_ref), "loss": [out["group"]["loss"], out["ref"]["loss"]],
                  "grad_norm": [out["group"]["grad_norm"], out["ref"]["grad_norm"]],
                  "err_mirror": diff(compute_log_probs(mirror, pad, prompts, responses, 1.0, 4096), after_ref),
                  "refused": refused}))
"""


def test_group_of_one_on_nccl_matches_the_torch_trainer():
    over = [*TINY, "training.trainer=megatron", "resources.actor.gpus=1", "resources.actor.workers=1",
            "training.lr=1e-3", "training.grad_clip=100"]
    env = dict(os.environ, MASTER_PORT="29650")
    out = subprocess.run([sys.executable, "-c", _GROUP, json.dumps(over)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["is_group"] and r["ranks"] == 1 and r["refused"], r
    assert r["err_before"] < 2e-3 and r["err_after"] < 2e-3 and r["moved"] > 0.05, r
    assert abs(r["loss"][0] - r["loss"][1]) < 1e-3 * max(1.0, abs(r["loss"][1])), r
    assert abs(r["grad_norm"][0] - r["grad_norm"][1]) < 1e-2 * r["grad_norm"][1], r
    assert r["err_mirror"] < 2e-3, r  # gathered shards -> HF names -> transformers: the trained weights


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("ray", "transfer_queue", "reasoning_gym")),
                    reason="the whole project environment (Ray, TransferQueue, reasoning-gym) is not installed")
def test_relax_run_places_the_megatron_actor_on_the_gpu(tmp_path):
    """`relax run` with the Actor's group on the GPU: the supervisor makes the placement group (one GPU bundle), the
    Actor runs rank 0 on it over NCCL, trains, publishes through DCS, and the rollout engine (CPU) generates with
    the published versions (on-policy)."""
    from relax.config import load_config
    from relax.controller import run_experiment

    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [
        *TINY, "steps=2", "max_staleness=0", "training.trainer=megatron", "resources.actor.gpus=1",
        "resources.actor.workers=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=2",
        "warmup.steps=40", "task.eval_size=0", "algorithm.kl_coef=0"])
    run_dir, summary = run_experiment(cfg, out=tmp_path, progress=False)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["weight_version"] for r in rows] == [1, 2] and all(r["trainer_ranks"] == 1 for r in rows), rows
    assert all(r["staleness_max"] == 0 and r["update_ok"] for r in rows), rows
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
