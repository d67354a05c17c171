"""Agentic multi-turn rollouts: tools, error observations, loss masks across turns, turn cap, media carry-over."""

from __future__ import annotations

import time

import torch

from relax.agent import MediaRef, MultiTurnRollout, ToolBox, ToolEnv, calculate, parse_tool_call, run_python, trajectory_rows
from relax.engines.torch_engine import Generation
from relax.models.tokenizer import CharTokenizer

TOK = CharTokenizer()


class ScriptedEngine:
    """Plays fixed model turns (per row, in order); each token's log-prob is a recognisable negative number.
    The extra text after a tool call stands for what a real model samples past `</tool>` (it must be cut)."""

    def __init__(self, scripts, accepts_media=False):
        self.scripts = [list(s) for s in scripts]
        self.calls = []
        self.accepts_media = accepts_media

    def generate(self, prompts, max_new_tokens, media=None):
        self.calls.append({"prompts": [list(p) for p in prompts], "media": media})
        out = []
        for p in prompts:
            row = next(i for i, s in enumerate(self.scripts) if s and self._owner[i] == tuple(p[: self._plen[i]]))
            text = self.scripts[row].pop(0)
            ids = TOK.encode(text, add_bos=False)[:max_new_tokens]
            if len(ids) < max_new_tokens:
                ids.append(TOK.eos_token_id)
            out.append(Generation(ids, [-0.25 - 0.001 * j for j in range(len(ids))],
                                  "stop" if ids[-1] == TOK.eos_token_id else "length", 7))
        return out

    def bind(self, prompts):
        self._owner = [tuple(p) for p in prompts]
        self._plen = [len(p) for p in prompts]


def drive(scripts, questions, answers, max_turns=4, tools=None, media_tools=None, media_ids=None, accepts_media=False,
          max_new_tokens=48):
    eng = ScriptedEngine(scripts, accepts_media)
    eng.bind([TOK.encode(q) for q in questions])
    envs = [ToolEnv(tools=tools, media_tools=media_tools) for _ in questions]
    ro = MultiTurnRollout(eng, TOK, max_turns=max_turns, max_new_tokens=max_new_tokens, max_total_tokens=1024,
                          media_ids=media_ids)
    rows = [{"question": q, "answer": a} for q, a in zip(questions, answers)]
    return ro.run(envs, rows), envs, eng


def test_calculator_is_safe():
    assert calculate("3*4+2**3") == 20
    assert calculate("sqrt(16) / 2") == 2
    for bad in ["__import__('os')", "().__class__", "9**9**9", "open('x')", "a+1", "1 if 1 else 2", "x" * 500]:
        try:
            calculate(bad)
        except ValueError:
            continue
        raise AssertionError(f"calculate accepted {bad!r}")


def test_parse_tool_call():
    c = parse_tool_call("think <tool>calc: 3*4</tool> tail")
    assert (c.name, c.argument) == ("calc", "3*4") and "think <tool>calc: 3*4</tool>"[c.end - 1] == ">"
    assert parse_tool_call("no call <tool>calc 3</tool>") is None
    assert parse_tool_call("<tool>calc: 3") is None


def test_python_sandbox_limits():
    assert run_python("print(sum(range(10)))").strip() == "45"
    box = ToolBox()
    t0 = time.time()
    text, ok = box.call("python", "while True: pass")
    assert not ok and "timed out" in text and time.time() - t0 < 10
    text, ok = box.call("python", "x = bytearray(2 * 1024**3)")  # over the 256 MiB address-space limit
    assert not ok and "MemoryError" in text
    text, ok = box.call("python", "raise ValueError('boom')")
    assert not ok and "ValueError: boom" in text
    text, ok = box.call("python", "import os; print(sorted(os.environ))")
    assert ok and "HOME" not in text  # empty environment


def test_bad_tools_become_error_observations():
    class Weird:
        def __repr__(self):
            raise RuntimeError("no repr")

    def raises(_):
        raise ZeroDivisionError("bad")

    def garbage(_):
        return "\x00\x07ok\xff" * 1000

    def exits(_):
        raise SystemExit(3)

    box = ToolBox({"raises": raises, "garbage": garbage, "weird": lambda _: Weird(), "exits": exits,
                   "hang": lambda a: run_python("import time; time.sleep(30)", timeout_s=0.5)})
    scripts = [["<tool>raises: 1</tool>", "<tool>garbage: 1</tool>", "<tool>weird: 1</tool>", "<tool>exits: 1</tool>",
                "<tool>hang: 1</tool>", "<tool>nosuch: 1</tool>", "<answer>5</answer>"]]
    (t,), (env,), _ = drive(scripts, ["Q?"], ["5"], max_turns=10, tools=box)
    obs = [TOK.decode(t.response_ids[a:b]) for kind, a, b in t.spans if kind == "obs"]
    assert obs[0] == "<obs>error: ZeroDivisionError: bad</obs>"
    assert obs[1].startswith("<obs>") and all(32 <= ord(c) < 127 for c in obs[1]) and len(obs[1]) <= 220
    assert obs[2].startswith("<obs>error: unprintable")
    assert obs[3].startswith("<obs>error: SystemExit")
    assert "timed out" in obs[4]
    assert "unknown tool" in obs[5]
    assert t.done and t.reward == 1.0 and env.session.tool_errors == 5 and t.turns == 7  # garbage is cleaned, not an error


def test_loss_mask_covers_exactly_model_tokens():
    scripts = [["<tool>calc: 3*4</tool> junk after the call", "<tool>python: print(12+5)</tool>", "<answer>17</answer>"],
               ["<answer>9</answer>"]]
    trajs, _, eng = drive(scripts, ["What is 3*4+5?", "4+5?"], ["17", "9"])
    t = trajs[0]
    model_text = "<tool>calc: 3*4</tool>" + "<tool>python: print(12+5)</tool>" + "<answer>17</answer>"
    expected_model = TOK.encode(model_text, add_bos=False) + [TOK.eos_token_id]
    mask = torch.tensor(t.loss_mask, dtype=torch.bool)
    resp = torch.tensor(t.response_ids)
    assert resp[mask].tolist() == expected_model  # the model's own tokens, all of them, in order
    assert TOK.decode(resp[~mask].tolist()) == "<obs>12</obs><obs>17</obs>"  # tool replies only
    lp = torch.tensor(t.log_probs)
    assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    assert t.reward == 1.0 and t.turns == 3 and not t.truncated
    # every turn saw the whole context so far (prompt + earlier turns + observations)
    assert eng.calls[1]["prompts"][0] == t.prompt_ids + t.response_ids[: t.spans[1][2]]
    assert trajs[1].reward == 1.0 and trajs[1].turns == 1
    rows = trajectory_rows(trajs)
    for i in range(2):
        assert len(rows["loss_mask"][i]) == len(rows["response_ids"][i]) == len(rows["rollout_log_probs"][i])
    assert rows["num_turns"].tolist() == [3, 1]


def test_turn_cap():
    scripts = [["<tool>calc: 1+1</tool>"] * 10]
    (t,), _, eng = drive(scripts, ["loop"], ["2"], max_turns=3)
    assert t.turns == 3 and t.truncated and not t.done and len(eng.calls) == 3
    assert sum(1 for k, *_ in t.spans if k == "model") == 3
    assert t.loss_mask[-1] == 1  # no observation after the last permitted turn


def test_images_carry_over_turns():
    def look(arg, session):
        return MediaRef("image", f"digits://{arg.strip()}", 0, torch.full((4, 16), float(arg)))

    IMG = 99
    scripts = [["<tool>look: 3</tool>", "<tool>look: 5</tool>", "<tool>calc: 3+5</tool>", "<answer>8</answer>"]]
    (t,), (env,), eng = drive(scripts, ["Sum the digits"], ["8"], media_tools={"look": look},
                              media_ids=lambda m: [IMG] * 4, accepts_media=True)
    seen = [[m.uri for m in c["media"][0]] for c in eng.calls]
    assert seen == [[], ["digits://3"], ["digits://3", "digits://5"], ["digits://3", "digits://5"]]
    assert [m.turn for m in env.session.media] == [1, 2]
    assert torch.equal(env.session.media[0].features, torch.full((4, 16), 3.0))
    assert t.reward == 1.0 and t.response_ids.count(IMG) == 8
    mask = torch.tensor(t.loss_mask, dtype=torch.bool)
    assert IMG not in torch.tensor(t.response_ids)[mask].tolist()  # media placeholders are never trained on


def test_real_engine_multiturn():
    """The driver over TorchEngine with a tiny random model: shapes and masks line up, nothing crashes."""
    from transformers import AutoModelForCausalLM

    from relax.config import ModelConfig
    from relax.engines import TorchEngine
    from relax.models import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(ModelConfig(hidden_size=32, num_layers=1, intermediate_size=64), TOK.vocab_size))
    eng = TorchEngine(model, TOK, seed=0)
    ro = MultiTurnRollout(eng, TOK, max_turns=3, max_new_tokens=12, max_total_tokens=200)
    trajs = ro.run([ToolEnv() for _ in range(4)], [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(4)])
    for t in trajs:
        assert len(t.response_ids) == len(t.loss_mask) == len(t.log_probs) and 1 <= t.turns <= 3
        assert sum(t.loss_mask) >= 1
