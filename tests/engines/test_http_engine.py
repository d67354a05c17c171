"""The SGLang adapter's client drives the torch engine's HTTP server over real HTTP (a child process)."""

import threading
import time

import pytest
import torch

from relax.config import ModelConfig, load_config
from relax.engines.http_server import GenerateReq, SamplingParams, build_server, launch_torch_server
from relax.engines.sglang import EngineClient, EngineError, WeightSync, buckets, connect_engines, sglang_server_args
from relax.models import build_model
from relax.trainers import compute_log_probs
from relax.trainers.megatron import hf_state_from_model

MODEL = dict(kind="tiny_qwen3_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
             num_experts=4, experts_per_token=2)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("srv") / "server.log"
    srv = launch_torch_server(MODEL, seed=0, log_path=str(log))
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server):
    c = connect_engines([server.url])[0]
    yield c
    c.close()


def _local(seed=0):
    model, tok = build_model(ModelConfig(**MODEL), seed)
    return model.eval(), tok


def _prompts(tok):
    return [tok.encode("What is 3 + 4? Answer:"), tok.encode("12 - 5 ="), tok.encode("7*6")]


def _recompute(model, tok, prompts, gens, temperature=1.0):
    return compute_log_probs(model, tok.pad_token_id, [torch.tensor(p) for p in prompts],
                             [torch.tensor(g.token_ids) for g in gens], temperature, 4096)


def _check_log_probs(model, tok, prompts, gens, temperature=1.0):
    for lp, g in zip(_recompute(model, tok, prompts, gens, temperature), gens):
        assert len(g.token_ids) == len(g.log_probs) > 0
        torch.testing.assert_close(lp, torch.tensor(g.log_probs), atol=1e-4, rtol=0)


def test_generate_returns_sglang_shaped_output_with_log_probs(client):
    model, tok = _local()
    prompts = _prompts(tok)
    gens = client.generate(prompts, 12, temperature=1.0)
    assert len(gens) == 3
    _check_log_probs(model, tok, prompts, gens)
    for g in gens:
        assert g.finish_reason in ("stop", "length") and g.weight_version == 0
        assert (g.finish_reason == "length") == (len(g.token_ids) == 12 and tok.eos_token_id not in g.token_ids)
    raw = client.generate_raw({"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                               "return_logprob": True})
    assert isinstance(raw, dict)  # one prompt -> one object, as SGLang
    meta = raw["meta_info"]
    assert meta["prompt_tokens"] == len(prompts[0]) and meta["completion_tokens"] == len(raw["output_ids"])
    assert [x[1] for x in meta["output_token_logprobs"]] == raw["output_ids"]
    assert raw["text"] == tok.decode(raw["output_ids"])


def test_routed_experts_match_the_models_router(client):
    model, tok = _local()
    prompts = _prompts(tok)
    gens = client.generate(prompts, 6, temperature=1.0, return_routed_experts=True, moe_shape=(2, 2))
    for p, g in zip(prompts, gens):
        routes = g.extras["routed_experts"]
        seq = p + g.token_ids[:-1]  # every token the engine fed to the model
        assert routes.shape == (len(seq), 2, 2)
        chosen = []
        hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, o: chosen.append(o[2]))
                 for layer in model.model.layers]
        with torch.no_grad():
            model(torch.tensor([seq]))
        for h in hooks:
            h.remove()
        want = torch.stack(chosen, dim=1)  # [tokens, layers, top_k]
        assert torch.equal(torch.from_numpy(routes.copy()).long().sort(-1).values, want.sort(-1).values)


def _wait_forwards(client, at_least, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        n = client.server_info()["forwards"]
        if n >= at_least:
            return n
        time.sleep(0.005)
    raise AssertionError("generation made no progress")


def test_pause_update_continue_with_a_request_in_flight(client):
    model, tok = _local()
    other, _ = _local(seed=7)
    prompts = [tok.encode("1+1=")] * 32
    result = {}
    start = client.server_info()["forwards"]
    t = threading.Thread(target=lambda: result.setdefault("gens", client.generate(prompts, 230)))
    t.start()
    _wait_forwards(client, start + 3)
    client.pause("in_place")
    parked = client.server_info()["forwards"]
    time.sleep(0.5)
    assert t.is_alive() and client.server_info()["forwards"] == parked  # parked at a decode step
    assert client.health()
    # A new request waits while paused.
    late = {}
    t2 = threading.Thread(target=lambda: late.setdefault("gens", client.generate(prompts[:2], 4, temperature=0.0)))
    t2.start()
    # The weight update goes through while the in-flight request is parked (no deadlock).
    res = client.update_weights_from_safetensors(hf_state_from_model(other), version=1)
    assert res["success"] and client.weight_version() == "1"
    time.sleep(0.2)
    assert t2.is_alive() and t.is_alive()
    client.continue_generation()
    t.join(60)
    t2.join(60)
    assert not t.is_alive() and len(result["gens"]) == 32
    assert all(g.weight_version == 1 for g in late["gens"])
    _check_log_probs(other, tok, prompts[:2], late["gens"], temperature=1.0)  # greedy log-probs are under T = 1
    client.update_weights_from_safetensors(hf_state_from_model(model), version=2)  # restore for other tests


def test_pause_abort_ends_the_in_flight_request(client):
    _, tok = _local()
    prompts = [tok.encode("9-3=")] * 32
    result = {}
    start = client.server_info()["forwards"]
    t = threading.Thread(target=lambda: result.setdefault("raw", client.generate_raw(
        {"input_ids": prompts, "sampling_params": {"max_new_tokens": 230}, "return_logprob": True})))
    t.start()
    _wait_forwards(client, start + 3)
    client.pause("abort")
    t.join(30)
    assert not t.is_alive()
    # sequences that ended before the abort reply as usual (continuous batching, as SGLang); the rest are aborted
    ends = [o["meta_info"]["finish_reason"]["type"] for o in result["raw"]]
    assert "abort" in ends and set(ends) <= {"abort", "stop", "length"}
    assert all(len(o["output_ids"]) < 230 for o in result["raw"] if o["meta_info"]["finish_reason"]["type"] != "stop")
    client.continue_generation()
    assert client.generate(prompts[:1], 2)[0].finish_reason in ("stop", "length")


def test_concurrent_requests_decode_in_one_continuous_batch():
    """Three callers' requests (one greedy, two sampled, different limits) wait while the engine is busy, then join
    one batch: the engine runs as many forwards as the longest needs (one at a time would take their sum), and the
    greedy request gets the tokens it gets alone."""
    server = build_server(MODEL, seed=0)
    tok = server.tok
    reqs = [GenerateReq(input_ids=tok.encode("2+2="), sampling_params=SamplingParams(max_new_tokens=12, temperature=0)),
            GenerateReq(input_ids=tok.encode("5*3="), sampling_params=SamplingParams(max_new_tokens=20)),
            GenerateReq(input_ids=tok.encode("9-1="), sampling_params=SamplingParams(max_new_tokens=7, top_p=0.9))]
    replies = [None] * 3

    def call(i):
        replies[i] = server.generate(reqs[i])

    with server._gen_lock:  # the engine is busy: all three wait for the next batch
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while len(server._waiting) < 3 and time.time() < deadline:
            time.sleep(0.005)
        start = server.forwards
    for t in threads:
        t.join(60)
    lengths = [r["meta_info"]["completion_tokens"] for r in replies]
    assert all(0 < n <= r.sampling_params.max_new_tokens for n, r in zip(lengths, reqs))
    assert server.forwards - start == max(lengths)  # one prefill, then a decode step per token of the longest
    assert server.generate(reqs[0])["output_ids"] == replies[0]["output_ids"]  # greedy: the same alone


def test_weight_sync_by_distributed_broadcast_in_buckets(client):
    other, tok = _local(seed=11)
    named = hf_state_from_model(other)
    sync = WeightSync([client], transport="distributed", backend="gloo", bucket_bytes=64 << 10)
    try:
        stats = sync.push(iter(named.items()), version=5)
        assert stats["buckets"] > 1 and stats["bytes"] == sum(t.numel() * 4 for t in named.values())
        assert client.weight_version() == "5"
        prompts = _prompts(tok)
        gens = client.generate(prompts, 8, temperature=1.0)
        assert all(g.weight_version == 5 for g in gens)
        _check_log_probs(other, tok, prompts, gens)
        sync.push(iter(hf_state_from_model(_local()[0]).items()), version=6)  # a second version, same group
        assert client.weight_version() == "6"
    finally:
        sync.close()


def test_weight_sync_from_disk(client, tmp_path):
    other, tok = _local(seed=12)
    sync = WeightSync([client], transport="disk", share_dir=str(tmp_path))
    sync.push(hf_state_from_model(other).items(), version=8)
    assert client.weight_version() == "8" and (tmp_path / "weights_v8.safetensors").is_file()
    prompts = _prompts(tok)
    _check_log_probs(other, tok, prompts, client.generate(prompts, 6))
    sync.push(hf_state_from_model(_local()[0]).items(), version=9)


def test_bad_requests_are_rejected_naming_the_field(client):
    with pytest.raises(EngineError, match="sampling_params.top_k"):
        client.generate_raw({"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2, "top_k": 5}})
    with pytest.raises(EngineError, match="HTTP 400.*bogus"):
        client.generate_raw({"input_ids": [1, 5], "bogus": 1})
    with pytest.raises(EngineError, match="input_ids"):
        client.generate_raw({"input_ids": [1, 100000]})
    with pytest.raises(EngineError, match="model.layers.0.nope.weight"):
        client.update_weights_from_safetensors({"model.layers.0.nope.weight": torch.zeros(2)})
    with pytest.raises(EngineError, match="shape"):
        client.update_weights_from_safetensors({"model.norm.weight": torch.zeros(3)})
    with pytest.raises(EngineError, match="load_format"):
        client._weights("/update_weights_from_tensor", {"serialized_named_tensors": ["xx"]})
    assert client.weight_version() == "9" or client.weight_version().isdigit()


def test_health_checks_and_stop_by_pid(tmp_path):
    srv = launch_torch_server(dict(kind="tiny_qwen3", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                   intermediate_size=64))
    c = EngineClient(srv.url)
    try:
        assert c.health() and c.health_generate()
        assert c.server_info()["num_moe_layers"] == 0
        with pytest.raises(EngineError, match="return_routed_experts"):
            c.generate([[1, 4]], 2, return_routed_experts=True)
    finally:
        srv.stop()
    assert srv.proc.poll() is not None and not c.health()


def test_buckets_respect_the_byte_budget():
    named = [(f"t{i}", torch.zeros(100)) for i in range(10)] + [("big", torch.zeros(5000))]
    got = list(buckets(named, 1200))
    assert [len(b) for b in got] == [3, 3, 3, 1, 1]
    assert [n for b in got for n, _ in b] == [n for n, _ in named]


def test_sglang_launch_command_from_the_cluster_config():
    cfg = load_config("experiments/async/h800x16.yaml")
    argv = sglang_server_args(cfg, 2, port=30004)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    opts = dict(zip(argv[3::1], argv[4::1]))
    assert opts["--model-path"] == "/models/Qwen3-4B" and opts["--tp-size"] == "1" and opts["--port"] == "30004"
    assert opts["--dtype"] == "bfloat16" and opts["--random-seed"] == "2"
    assert "--enable-memory-saver" not in argv and "--enable-return-routed-experts" not in argv
    colo = load_config("experiments/colocate/h800x16.yaml")
    assert "--enable-memory-saver" in sglang_server_args(colo, 0, port=1)
    moe = load_config("experiments/async/h800x16.yaml", ["model.path=/models/Qwen3-30B-A3B", "rollout.replicas=2"])
    argv = sglang_server_args(moe, 0, port=1)
    assert "--enable-return-routed-experts" in argv and argv[argv.index("--tp-size") + 1] == "2"
    with pytest.raises(ValueError, match="rollout.replicas=3"):
        sglang_server_args(load_config("experiments/async/h800x16.yaml", ["rollout.replicas=3"]), 0, port=1)
