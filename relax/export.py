"""`relax export RUN_DIR --to DIR`: the trained policy as a Hugging Face folder.

A run keeps its final weights in `RUN_DIR/final_weights.safetensors` (written by the controller at the end of a
run through `save_final_weights`; names are the transformers model's state-dict names). Export rebuilds the
model the run's `config.yaml` describes, loads those weights, and writes:

- `model.safetensors` + `config.json` + `generation_config.json` (`save_pretrained`, checkpoint names: per-expert
  MoE tensors, no duplicated tied lm_head), loadable with `AutoModelForCausalLM.from_pretrained(DIR)`;
- the tokenizer: a pretrained model's own Hugging Face tokenizer files, or for the tiny models' character tokenizer
  an equivalent fast tokenizer (`tokenizer.json`: printable ASCII, one id per character, BOS prepended, other
  characters read as '?') so `AutoTokenizer.from_pretrained(DIR)` gives exactly `CharTokenizer`'s ids, plus
  `relax_tokenizer.json` describing it (`load_char_tokenizer(DIR)` returns a `CharTokenizer`);
- `export_check.json`: the largest log-prob difference between the reloaded folder and the trained weights on
  probe sequences (export fails if it exceeds 1e-5).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from relax.run_folder import CONFIG, FINAL_WEIGHTS


class ExportError(RuntimeError):
    pass


def save_final_weights(run_dir: str | Path, state: dict[str, torch.Tensor], version: int | None = None) -> Path:
    """Write a run's final policy weights (atomic: a reader never sees a half-written file)."""
    return save_weights(Path(run_dir) / FINAL_WEIGHTS, state, version)


def save_weights(path: Path, state: dict[str, torch.Tensor], version: int | None = None) -> Path:
    """Write policy weights in transformers state-dict names to `path` (atomic), creating its folder."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    meta = {"format": "relax-final-weights", "names": "transformers-state-dict"}
    if version is not None:
        meta["weight_version"] = str(version)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


def char_tokenizer_fast():
    """A transformers fast tokenizer with exactly CharTokenizer's ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from relax.models.tokenizer import _FIRST, _LAST, _OFFSET, BOS, EOS, PAD

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS}
    vocab.update({chr(c): _OFFSET + c - _FIRST for c in range(_FIRST, _LAST + 1)})
    tk = Tokenizer(models.WordLevel(vocab))
    tk.normalizer = normalizers.Replace(Regex("[^ -~]"), "?")  # as CharTokenizer: anything else reads as '?'
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def load_char_tokenizer(folder: str | Path):
    """The CharTokenizer an exported tiny model was trained with (checks the folder's description)."""
    from relax.models.tokenizer import CharTokenizer

    desc = json.loads((Path(folder) / "relax_tokenizer.json").read_text())
    if desc.get("type") != "char" or desc.get("vocab_size") != CharTokenizer.vocab_size:
        raise ExportError(f"{folder}: relax_tokenizer.json does not describe Relax's character tokenizer")
    return CharTokenizer()


def _char_description() -> dict:
    from relax.models.tokenizer import _FIRST, _LAST, _OFFSET, CharTokenizer

    return {"type": "char", "vocab_size": CharTokenizer.vocab_size, "pad_token_id": CharTokenizer.pad_token_id,
            "bos_token_id": CharTokenizer.bos_token_id, "eos_token_id": CharTokenizer.eos_token_id,
            "first_char_id": _OFFSET, "chars": "".join(chr(c) for c in range(_FIRST, _LAST + 1)),
            "unknown_char": "?", "adds_bos": True,
            "load": "AutoTokenizer.from_pretrained(DIR) (tokenizer.json), or relax.export.load_char_tokenizer(DIR)"}


def _probe_log_probs(model, seqs: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        out = []
        for s in seqs:
            ids = torch.tensor([s])
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
            out.append(logp[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1))
    return torch.cat(out)


def export_run(run_dir: str | Path, to: str | Path, *, seed: int | None = None, tolerance: float = 1e-5) -> dict:
    """Export RUN_DIR's final weights to a Hugging Face folder; returns what export_check.json records."""
    import yaml
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from relax.config import validate
    from relax.models import build_model

    run_dir, to = Path(run_dir), Path(to)
    cfg_path, weights = run_dir / CONFIG, run_dir / FINAL_WEIGHTS
    if not cfg_path.is_file():
        raise ExportError(f"{run_dir}: no {CONFIG} (is this a run folder?)")
    if not weights.is_file():
        raise ExportError(f"{run_dir}: no {FINAL_WEIGHTS}; runs save it when they finish (older runs did not)")
    cfg = validate(yaml.safe_load(cfg_path.read_text()))
    # transformers' model whatever trained it: the native Qwen3 has its parameter names, and only this one has
    # save_pretrained
    mcfg = cfg.model.model_copy(update={"implementation": "transformers"})
    model, tok = build_model(mcfg, cfg.seed if seed is None else seed)
    state = load_file(str(weights))
    res = model.load_state_dict(state, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = [k for k in res.missing_keys if not (tied and k == "lm_head.weight")]
    if missing or res.unexpected_keys:
        raise ExportError(f"{weights}: does not match model {cfg.model.kind}: missing {missing[:5]}, "
                          f"unexpected {list(res.unexpected_keys)[:5]}")
    model = model.float().eval()
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None  # a model converted from GGUF saves as plain weights
    to.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(to, safe_serialization=True)
    if hasattr(tok, "tok"):  # HFTokenizer around a transformers tokenizer
        tok.tok.save_pretrained(to)
        tokenizer_kind = "hf"
    else:
        char_tokenizer_fast().save_pretrained(to)
        (to / "relax_tokenizer.json").write_text(json.dumps(_char_description(), indent=2))
        tokenizer_kind = "char"
    # Reload exactly as a user would and compare log-probs with the trained weights.
    reloaded = AutoModelForCausalLM.from_pretrained(to, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    seqs = [tok.encode("What is 12 + 7? Answer:") + [int(x) for x in torch.randint(3, vocab, (8,), generator=g)],
            [int(x) for x in torch.randint(3, vocab, (16,), generator=g)]]
    diff = float((_probe_log_probs(reloaded, seqs) - _probe_log_probs(model, seqs)).abs().max())
    check = {"run_dir": str(run_dir), "export_dir": str(to), "model": cfg.model.kind, "tokenizer": tokenizer_kind,
             "max_abs_logprob_diff": diff, "probe_tokens": sum(len(s) - 1 for s in seqs),
             "tensors": len(state), "weights_meta": _meta(weights)}
    (to / "export_check.json").write_text(json.dumps(check, indent=2))
    if diff > tolerance:
        raise ExportError(f"exported model differs from the trained weights: max |d logprob| = {diff:.2e}")
    return check


def _meta(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}
