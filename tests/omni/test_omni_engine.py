"""Omni and agent training through the engine: config kinds, the trainer's loss mask and media inputs, the
agent reward rule, and end-to-end runs (Ray roles + TransferQueue bus) that check which fields each role got."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relax.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
OMNI = ROOT / "experiments/omni/cpu.yaml"
AGENT = ROOT / "experiments/agent/cpu.yaml"
MEDIA = {"image_patches", "audio_mel", "video_frames"}


# ---- config --------------------------------------------------------------------------------------------
def test_omni_and_agent_experiments_are_engine_configs():
    a = load_config(OMNI)
    assert (a.model.kind, a.task.kind, a.mode, a.max_staleness) == ("tiny_omni", "omni", "async", 1)
    c = load_config(OMNI, ["mode=colocate"])  # unset staleness follows the mode
    assert (c.mode, c.max_staleness) == ("colocate", 0)
    with pytest.raises(ConfigError, match="max_staleness must be 0"):
        load_config(OMNI, ["mode=colocate", "max_staleness=1"])
    with pytest.raises(ConfigError, match="task.kind"):
        load_config(OMNI, ["model.kind=tiny_qwen3"])  # no media encoders
    g = load_config(AGENT)
    assert g.task.kind == "agent" and g.agent.max_turns == 3 and g.agent.tools == ["calc", "python"]
    with pytest.raises(ConfigError, match="tool_answer"):
        load_config(AGENT, ["task.reward=exact"])
    with pytest.raises(ConfigError, match="schedule"):  # the emulations pass no media / masks to their forwards
        load_config(OMNI, ["schedule=verl"])
    with pytest.raises(ConfigError, match="agent.bogus"):
        load_config(AGENT, ["agent.bogus=1"])


def test_qwen3_omni_cluster_plan():
    cfg = load_config(ROOT / "experiments/omni/h800x16.yaml")
    assert cfg.task.kind == "omni" and cfg.model.kind == "hf" and "Qwen3-Omni-30B-A3B" in cfg.model.path
    from relax.plan import resolve_plan

    plan = resolve_plan(cfg)
    assert plan["cluster"]["nodes"] == 2 and plan["cluster"]["gpus"] == 16
    out = subprocess.run([sys.executable, "-m", "relax.cli", "run", str(ROOT / "experiments/omni/h800x16.yaml"),
                          "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sglang" in out.stdout and "megatron" in out.stdout


# ---- trainer: loss mask and media ----------------------------------------------------------------------
def _tiny_omni():
    from relax.omni.model import build_tiny_omni

    return build_tiny_omni(hidden_size=32, num_layers=1, intermediate_size=64, seed=0)


def _omni_rows():
    from relax.omni.processor import OmniProcessor
    from relax.omni.tokenizer import OmniTokenizer

    tok = OmniTokenizer()
    rows = OmniProcessor(tok).rows([{"media": {"image": "digits://3", "audio": "dtmf://5/11"}, "text": " sum="},
                                    {"media": {"image": "digits://8", "audio": "dtmf://2/3"}, "text": " sum="}])
    rows["response_ids"] = [torch.tensor(tok.encode("8", add_bos=False) + [tok.eos_token_id]),
                            torch.tensor(tok.encode("10", add_bos=False) + [tok.eos_token_id])]
    return tok, rows


def test_trainer_reads_media_fields():
    from relax.trainers import compute_log_probs

    tok, rows = _omni_rows()
    model = _tiny_omni()
    media = {k: rows[k] for k in MEDIA}
    a = compute_log_probs(model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], 1.0, 4096, None, media)
    shifted = {**media, "image_patches": [x + 1 for x in media["image_patches"]]}
    b = compute_log_probs(model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], 1.0, 4096, None, shifted)
    assert not torch.allclose(torch.cat(a), torch.cat(b))  # the pixels reach the forward
    # one row at a time (micro-batching by token budget) gives the same numbers: rows keep their own media
    c = compute_log_probs(model, tok.pad_token_id, rows["prompt_ids"], rows["response_ids"], 1.0, 1, None, media)
    assert torch.allclose(torch.cat(a), torch.cat(c), atol=1e-5)


def _agent_mb(obs_adv: float):
    """One two-turn episode: model tokens, then an observation, then model tokens; advantages on the
    observation tokens are `obs_adv` (must not matter)."""
    ids = torch.arange(5, 15)
    mask = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 1, 1], dtype=torch.float32)
    adv = torch.where(mask.bool(), torch.full((10,), 0.5), torch.full((10,), obs_adv))
    old = torch.where(mask.bool(), torch.full((10,), -2.0), torch.zeros(10))
    return {"prompt_ids": [torch.tensor([1, 20, 21])], "response_ids": [ids], "loss_mask": [mask],
            "advantages": [adv], "old_log_probs": [old], "rollout_log_probs": [old]}


def test_trainer_loss_covers_only_masked_tokens():
    from transformers import AutoModelForCausalLM

    from relax.algorithms import LossScale
    from relax.config import ModelConfig
    from relax.models import tiny_config
    from relax.models.tokenizer import CharTokenizer
    from relax.trainers import TorchTrainer, compute_log_probs

    cfg = load_config(AGENT)
    grads = []
    for obs_adv in (0.0, 100.0):
        torch.manual_seed(0)
        small = ModelConfig(hidden_size=32, num_layers=1, intermediate_size=64)
        model = AutoModelForCausalLM.from_config(tiny_config(small, CharTokenizer.vocab_size))
        tr = TorchTrainer(model, 0, cfg)
        tr.accumulate(_agent_mb(obs_adv), LossScale(total_tokens=7, total_seqs=1))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        mb = _agent_mb(obs_adv)
        lp = compute_log_probs(model, 0, mb["prompt_ids"], mb["response_ids"], 1.0, 4096, None,
                               {"loss_mask": mb["loss_mask"]})[0]
        assert (lp[3:6] == 0).all() and (lp[[0, 1, 2, 6, 7, 8, 9]] < 0).all()
    assert grads[0].abs().sum() > 0 and torch.equal(grads[0], grads[1])  # observation tokens carry no gradient
    with pytest.raises(ValueError, match="loss_mask"):
        from relax.trainers import pack

        pack([torch.tensor([1])], [torch.tensor([2, 3])], 0, [torch.tensor([1.0])])


# ---- agent reward rule = the environment's grade ---------------------------------------------------------
@pytest.mark.parametrize("turns,expected", [
    (["<tool>calc: 3*4</tool>", "<answer>12</answer>"], 1.0),
    (["<answer>11</answer>"], 0.0),
    (["no action at all"], 0.0),
    # turns as the rollout cuts them (just after the first </tool>); a malformed call ends the episode unanswered
    (["<tool>calc 3*4</tool>", "<answer>12</answer>"], 0.0),
    (["<answer>12</answer><tool>calc: 1</tool>", "<answer>5</answer>"], 0.0),  # a tool turn; the 2nd turn grades
])
def test_tool_answer_matches_the_environment(turns, expected):
    from relax.agent import ToolEnv
    from relax.agent.env import tool_answer
    from relax.tasks import Prompt

    env = ToolEnv()
    env.reset({"question": "3*4=", "answer": "12"})
    reward = 0.0
    for t in turns:
        res = env.step(t)
        reward += res.reward
        if res.done:
            break
    prompt = Prompt(0, "3*4=", "3*4=", "12")
    assert tool_answer("".join(turns), prompt) == reward == expected


def test_agent_task_and_warmup_trajectories():
    from relax.models.tokenizer import CharTokenizer
    from relax.agent.train import agent_batch
    from relax.tasks import make_task

    cfg = load_config(AGENT)
    data = make_task(cfg.task, 0, "train")
    p = data[3]
    assert p.answer == str(p.meta["a"] * p.meta["b"]) and p.prompt == f"{p.meta['a']}*{p.meta['b']}="
    tok = CharTokenizer()
    rows = agent_batch(tok, data, [3])
    resp, mask = rows["response_ids"][0], rows["loss_mask"][0].bool()
    assert tok.decode(resp[~mask]) == f"<obs>{p.answer}</obs>"
    assert tok.decode(resp[mask]) == f"<tool>calc: {p.meta['a']}*{p.meta['b']}</tool><answer>{p.answer}</answer>"


# ---- end to end through the engine -------------------------------------------------------------------
TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "warmup.steps=6",
        "warmup.batch_size=8", "task.eval_size=4", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.chunk_groups=1", "task.rl_pool=4"]


def _run(config, overrides, out):
    cmd = [sys.executable, "-m", "relax.cli", "run", str(config), "--steps", "2", "--out", str(out), "--no-progress",
           *TINY, *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = next(out.glob("*/cpu/*"))
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    trace = json.loads((run_dir / "trace.json").read_text())
    lanes = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    got: dict[str, set] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and "fields" in e["args"]:
            got.setdefault(lanes[e["tid"]], set()).update(e["args"]["fields"])
    assert [r["step"] for r in rows] == [0, 1] and summary["samples_lost"] == 0
    assert summary["samples_duplicated"] == 0 and summary["samples_trained"] == 2 * 4
    return rows, summary, got


@pytest.mark.slow
def test_omni_async_run_moves_media_only_to_model_roles(tmp_path):
    _, summary, got = _run(OMNI, [], tmp_path / "r")
    assert summary["mode"] == "async"
    assert got["reward"] and not got["reward"] & MEDIA  # the text-only role never received pixels
    assert not got["advantages"] & MEDIA
    assert MEDIA <= got["reference"] and MEDIA <= got["actor"]  # the forwards read every medium
    assert 0.0 <= summary["eval_accuracy_start"] <= 1.0


@pytest.mark.slow
def test_agent_colocate_run_trains_under_the_loss_mask(tmp_path):
    rows, summary, got = _run(AGENT, ["mode=colocate"], tmp_path / "r")
    assert summary["mode"] == "colocate" and summary["staleness_max"] == 0
    assert "loss_mask" in got["actor"] and "loss_mask" in got["reference"] and "loss_mask" in got["reward"]
    assert not got["actor"] & MEDIA
