import threading
import time

import torch

from relax.config import ModelConfig
from relax.engines import TorchEngine, sample_tokens
from relax.models import build_model, state_dict_cpu
from relax.trainers import compute_log_probs

SMALL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


def _engine(seed=0, **kw):
    model, tok = build_model(SMALL, seed)
    return TorchEngine(model, tok, seed=seed, **kw), tok


def _prompts(tok):
    return [tok.encode("What is 3 + 4? Answer:"), tok.encode("Compute 12 - 5.")] * 3


def test_engine_log_probs_match_trainer_recompute():
    eng, tok = _engine(temperature=0.8)
    prompts = _prompts(tok)
    gens = eng.generate(prompts, 10)
    lps = compute_log_probs(eng.model, tok.pad_token_id, [torch.tensor(p) for p in prompts],
                            [torch.tensor(g.token_ids) for g in gens], 0.8, 4096)
    for lp, g in zip(lps, gens):
        assert len(g.token_ids) == len(g.log_probs) == len(lp)
        torch.testing.assert_close(lp, torch.tensor(g.log_probs), atol=1e-5, rtol=0)
        assert g.finish_reason in ("stop", "length") and g.weight_version == 0


def test_greedy_is_temperature_zero_and_leaves_the_sampling_generator_alone():
    eng, tok = _engine(temperature=1.0)
    prompts = _prompts(tok)
    greedy = eng.greedy(prompts, 10)
    argmax, _ = _engine(temperature=0.0)
    assert [g.token_ids for g in greedy] == [g.token_ids for g in argmax.generate(prompts, 10)]
    assert eng.temperature == 1.0
    after_greedy = [g.token_ids for g in eng.generate(prompts, 10)]
    fresh, _ = _engine(temperature=1.0)
    assert after_greedy == [g.token_ids for g in fresh.generate(prompts, 10)]  # the same draws as without it
    assert after_greedy != [g.token_ids for g in greedy]  # and sampled, not greedy


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    toks, _ = sample_tokens(logits, 1.0, 0.7, torch.Generator().manual_seed(0))
    assert set(toks.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.7; the tail is never sampled
    full, _ = sample_tokens(logits, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert set(full.tolist()) == {0, 1, 2, 3}


def test_greedy_is_deterministic_and_stops_at_eos():
    eng, tok = _engine(temperature=0.0)
    a = eng.generate(_prompts(tok), 6)
    b = eng.generate(_prompts(tok), 6)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for g in a:
        assert (tok.eos_token_id in g.token_ids) == (g.finish_reason == "stop")


def test_weight_update_in_place_and_version_tag():
    eng, tok = _engine(temperature=0.0)
    other, _ = build_model(SMALL, seed=7)
    before = eng.generate(_prompts(tok), 6)
    eng.update_weights(state_dict_cpu(other), version=5)
    after = eng.generate(_prompts(tok), 6)
    assert all(g.weight_version == 5 for g in after)
    assert [g.token_ids for g in before] != [g.token_ids for g in after]


def test_sleep_releases_weights_and_wake_restores_them():
    eng, tok = _engine(temperature=0.0)
    state = state_dict_cpu(eng.model)
    ref = eng.generate(_prompts(tok), 6)
    freed = eng.sleep()
    assert freed == sum(t.numel() * 4 for t in state.values())
    assert all(p.numel() == 0 for p in eng.model.parameters())
    try:
        eng.generate(_prompts(tok), 2)
        raise AssertionError("generate while asleep must fail")
    except RuntimeError as err:
        assert "asleep" in str(err)
    eng.wake(state, version=1)
    assert [g.token_ids for g in eng.generate(_prompts(tok), 6)] == [g.token_ids for g in ref]


def test_pause_holds_generation_until_resume():
    eng, tok = _engine(temperature=1.0)
    eng.pause()
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("gens", eng.generate(_prompts(tok), 4)))
    worker.start()
    time.sleep(0.3)
    assert worker.is_alive() and "gens" not in result  # parked at a decode-step boundary, nothing lost
    eng.resume()
    worker.join(timeout=30)
    assert len(result["gens"]) == 6
