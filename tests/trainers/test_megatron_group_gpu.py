"""GPU checks of the Megatron worker group (`pytest -m gpu`, run by scripts/gpu_check.sh; skipped without CUDA).
One GPU holds one rank (NCCL refuses two ranks on one device), so these run the group code at world size 1:
`resources.actor.workers=1` builds a MegatronGroup of one on NCCL (dispatch, data-parallel split, metrics, the
shard gather and the optimizer state wrapper), checked against the torch trainer; with the whole project
environment installed (Ray, TransferQueue, reasoning-gym), a `relax run` whose Actor is placed on the GPU through
its placement group. The multi-rank dispatch itself is checked on the CPU (tests/trainers/test_megatron_group_cpu.py)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")]
TINY = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", "model.num_heads=4",
        "model.num_kv_heads=2"]

_GROUP = r"""
import json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = False
from relax.config import load_config
from relax.trainers.megatron.probe import compare_with_torch

print(json.dumps(compare_with_torch(load_config("experiments/async/cpu.yaml", json.loads(sys.argv[1])))))
"""


def test_group_of_one_on_nccl_matches_the_torch_trainer():
    over = [*TINY, "training.trainer=megatron", "resources.actor.gpus=1", "resources.actor.workers=1",
            "training.lr=1e-3", "training.grad_clip=100"]
    env = dict(os.environ, MASTER_PORT="29650")
    out = subprocess.run([sys.executable, "-c", _GROUP, json.dumps(over)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    mg, ref = r["metrics"]["megatron"], r["metrics"]["torch"]
    assert r["is_group"] and mg["trainer_ranks"] == 1 and r["refused_other_layout"], r
    assert r["err_before"] < 2e-3 and r["err_after"] < 2e-3 and r["moved"] > 0.05, r
    assert abs(mg["loss"] - ref["loss"]) < 1e-3 * max(1.0, abs(ref["loss"])), r
    assert abs(mg["grad_norm"] - ref["grad_norm"]) < 1e-2 * ref["grad_norm"], r
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
