"""Continuous batching (relax/engines/continuous.py): the same tokens as one-by-one generation (greedy), KV
rows freed as sequences finish, and requests handed back as they finish, not at the batch's end."""

import random

import torch

from relax.config import ModelConfig
from relax.engines import TorchEngine
from relax.engines.continuous import continuous_generate
from relax.engines.feed import fixed
from relax.engines.torch_engine import sample_tokens
from relax.models import build_model


def _engine(temperature=0.0):
    model, tok = build_model(ModelConfig(hidden_size=64, intermediate_size=128), seed=3)
    return TorchEngine(model, tok, temperature=temperature, seed=0), tok


def _prompts(tok, n, seed=0):
    rng = random.Random(seed)
    return [tok.encode(f"{rng.randint(0, 10 ** rng.randint(1, 4))}+{rng.randint(0, 99)}=") for _ in range(n)]


def test_greedy_tokens_equal_one_by_one_generation():
    engine, tok = _engine()
    prompts = _prompts(tok, 12)
    limits = [random.Random(i).randint(1, 24) for i in range(12)]  # a long-tailed mix of lengths
    alone = [engine.generate([p], n)[0] for p, n in zip(prompts, limits)]
    streamed = dict(engine.generate_stream(fixed(prompts, limits), max_inflight=4))
    assert sorted(streamed) == list(range(12))
    for i, g in enumerate(alone):
        assert streamed[i].token_ids == g.token_ids
        assert torch.allclose(torch.tensor(streamed[i].log_probs), torch.tensor(g.log_probs), atol=1e-4)
        assert streamed[i].finish_reason == g.finish_reason


def test_a_feed_refills_the_batch_mid_stream_with_the_same_tokens():
    """A feed that hands out work only as earlier requests finish (a Rollout replica claiming more groups while
    its last claim's tail decodes): late requests join the live batch, and every request's greedy tokens are
    those of one-by-one generation."""
    engine, tok = _engine()
    prompts = _prompts(tok, 8, seed=6)
    limits = [2, 16, 16, 3, 16, 5, 16, 4]
    alone = [engine.generate([p], n)[0] for p, n in zip(prompts, limits)]
    todo, asked, live = list(range(8)), [], []

    def feed(free):  # two at a time, and only while fewer than three are in flight
        asked.append(free)
        take = min(free, 2, len(todo))
        return [(prompts[i], limits[i]) for i in (todo.pop(0) for _ in range(take))]

    got = {}
    for i, g in engine.generate_stream(feed, max_inflight=3):
        got[i] = g
        live.append(len(got))
    assert sorted(got) == list(range(8))  # numbered in the order the feed gave them: here, list order
    assert all(got[i].token_ids == alone[i].token_ids for i in range(8))
    assert any(0 < f < 3 for f in asked)  # asked again while some were still decoding: it refilled mid-stream
    assert asked[-1] == 3 and not todo  # it ended once empty and the feed had nothing


def test_chunked_generate_honours_per_request_limits():
    engine, tok = _engine()
    prompts = _prompts(tok, 5, seed=1)
    gens = engine.generate(prompts, [1, 3, 5, 7, 9])
    for g, n in zip(gens, [1, 3, 5, 7, 9]):
        assert len(g.token_ids) <= n and (len(g.token_ids) == n or g.finish_reason == "stop")


def test_kv_rows_are_freed_as_sequences_finish_and_requests_join():
    engine, tok = _engine()
    prompts = _prompts(tok, 9, seed=2)
    limits = [2, 2, 2, 30, 30, 30, 30, 30, 30]
    sizes, order = [], []
    for row in continuous_generate(engine.model, fixed(prompts, limits), 3, tok.pad_token_id, -1,  # -1: never EOS
                                   lambda lg, numbers: sample_tokens(lg, 0.0, 1.0, engine.gen),
                                   on_step=lambda b: sizes.append((len(b), b.kv_rows))):
        order.append(row.index)
    assert all(rows == kv for rows, kv in sizes)  # the cache holds exactly the live rows
    assert max(n for n, _ in sizes) == 3
    # The three short ones finish first and free their rows for the next three at once; then the rest.
    assert order[:3] == [0, 1, 2] and sorted(order) == list(range(9))
    assert sizes[-1][0] <= 3 and sizes.count((3, 3)) >= 30  # the batch stayed full while requests waited


def test_sampled_stream_is_reproducible_for_a_seed():
    a, tok = _engine(temperature=1.0)
    b, _ = _engine(temperature=1.0)
    prompts = _prompts(tok, 6, seed=4)
    ga = dict(a.generate_stream(fixed(prompts, 12), max_inflight=3))
    gb = dict(b.generate_stream(fixed(prompts, 12), max_inflight=3))
    assert all(ga[i].token_ids == gb[i].token_ids for i in range(6))


def test_partial_rollout_updates_weights_mid_request_and_records_the_span():
    engine, tok = _engine()
    prompts = _prompts(tok, 6, seed=5)
    state = {n: p.detach().clone() + 0.01 for n, p in engine.model.named_parameters()}
    steps = []

    def between():  # as the Rollout's partial mode does: a new version arrives after the 5th decode step
        steps.append(1)
        if len(steps) == 5:
            engine.update_weights(state, 1)

    gens = dict(engine.generate_stream(fixed(prompts, [3, 3, 20, 20, 20, 20]), max_inflight=6, between=between))
    assert engine.version == 1
    for i in (2, 3, 4, 5):  # in flight across the update: went on, not restarted
        assert (gens[i].weight_version, gens[i].last_version) == (0, 1) and len(gens[i].token_ids) == 20
    for i in (0, 1):  # finished before it
        assert (gens[i].weight_version, gens[i].last_version) == (0, 0)
    p = next(engine.model.parameters())
    assert torch.equal(p, state[next(n for n, _ in engine.model.named_parameters())].to(p.dtype))
