"""`relax export`: a run's final weights become a Hugging Face folder that transformers reloads with equal log-probs."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from relax.cli import main
from relax.config import dump_config, load_config
from relax.export import ExportError, export_run, load_char_tokenizer, save_final_weights
from relax.models import build_model, state_dict_cpu
from relax.models.tokenizer import CharTokenizer

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
        "model.intermediate_size=64", "model.num_experts=4", "model.experts_per_token=2"]


def _fake_run(tmp_path, kind):
    """A run folder as the controller leaves it: config.yaml + final_weights.safetensors of a 'trained' model."""
    cfg = load_config("experiments/async/cpu.yaml", TINY + [f"model.kind={kind}"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    model, tok = build_model(cfg.model, cfg.seed)
    torch.manual_seed(5)
    with torch.no_grad():  # stand-in for RL updates: weights differ from the seeded initialisation
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_final_weights(run, state_dict_cpu(model), version=8)
    return run, model.eval(), tok


def _log_probs(model, ids):
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits.float(), -1)[0]
    return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


@pytest.mark.parametrize("kind", ["tiny_qwen3", "tiny_qwen3_moe"])
def test_export_reloads_in_transformers_with_matching_log_probs(tmp_path, kind):
    run, trained, tok = _fake_run(tmp_path, kind)
    out = tmp_path / "hf"
    check = export_run(run, out)
    assert check["max_abs_logprob_diff"] <= 1e-5 and check["weights_meta"]["weight_version"] == "8"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = "What is 17 + 25? Answer: 42"
    ids = hf_tok.encode(text)
    assert ids == tok.encode(text)  # the exported tokenizer gives the training ids
    torch.testing.assert_close(_log_probs(reloaded, ids), _log_probs(trained, ids), atol=1e-6, rtol=0)
    assert hf_tok.decode(ids, skip_special_tokens=True) == text
    assert isinstance(load_char_tokenizer(out), CharTokenizer)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == ("qwen3_moe" if kind.endswith("moe") else "qwen3")
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == CharTokenizer.eos_token_id


def test_cli_export_and_missing_weights_error(tmp_path, capsys):
    run, _, _ = _fake_run(tmp_path, "tiny_qwen3")
    assert main(["export", str(run), "--to", str(tmp_path / "out")]) == 0
    assert json.loads(capsys.readouterr().out)["max_abs_logprob_diff"] <= 1e-5
    (run / "final_weights.safetensors").unlink()
    with pytest.raises(ExportError, match="final_weights.safetensors"):
        export_run(run, tmp_path / "out2")
    assert main(["export", str(run), "--to", str(tmp_path / "out2")]) == 2
    assert "final_weights.safetensors" in capsys.readouterr().err


def test_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    run, _, _ = _fake_run(tmp_path, "tiny_qwen3")
    other = load_config("experiments/async/cpu.yaml", TINY + ["model.num_layers=1"])
    model, _ = build_model(other.model, 0)
    save_final_weights(run, state_dict_cpu(model))
    with pytest.raises(ExportError, match="missing"):
        export_run(run, tmp_path / "out")
