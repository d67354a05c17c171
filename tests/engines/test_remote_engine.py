"""RemoteEngine (relax/engines/remote.py): the Rollout role's engine interface over an SGLang-API server.

Against a launched torch engine server (`rollout.engine=torch_http`): generation carries the same log-probs as the
in-process model gives the sampled tokens, weights pushed through pause -> flush -> update -> continue reach the
server, a dead server is reported as such; and the config checks of rollout.engine / engine_urls.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relax.config import load_config
from relax.engines.feed import fixed
from relax.engines.remote import EngineDied, check_engine_available, make_remote_engine, sglang_available
from relax.engines.torch_engine import TorchEngine
from relax.models import build_model

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.hidden_size=64", "model.intermediate_size=128", "rollout.temperature=0.8", "rollout.top_p=1.0"]


def _cfg(*over):
    return load_config(ROOT / "experiments/async/cpu.yaml", [*TINY, *over])


def _teacher_forced(model, prompt, tokens, temperature):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.slow
def test_remote_engine_matches_in_process_engine():
    cfg = _cfg("rollout.engine=torch_http")
    model, tok = build_model(cfg.model, 123)  # weights the server does not start with (it builds seed 1)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    eng = make_remote_engine(cfg, 0, health_timeout=120)
    try:
        eng.update_weights(state, 3)
        assert eng.server_weight_version() == "3"
        prompts = [tok.encode("1 + 2 = Answer:"), tok.encode("7 - 5 Answer:"), tok.encode("3+3")]
        gens = eng.generate(prompts, 8)
        assert len(gens) == 3
        for p, g in zip(prompts, gens):
            assert g.weight_version == 3 and g.finish_reason in ("stop", "length")
            assert len(g.token_ids) == len(g.log_probs) > 0
            ref = _teacher_forced(model, p, g.token_ids, cfg.rollout.temperature)
            torch.testing.assert_close(torch.tensor(g.log_probs), ref, atol=1e-4, rtol=1e-4)
        # The in-process TorchEngine with the same weights and sampling seed draws the same tokens (the server
        # batches continuously: one request's prompts join one batch together).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the server runs one thread: same reduction order
        try:
            local = TorchEngine(model, tok, temperature=cfg.rollout.temperature, seed=cfg.seed + 1)
            mine = [g for _, g in sorted(local.generate_stream(fixed(prompts, 8), max_inflight=len(prompts)))]
        finally:
            torch.set_num_threads(threads)
        for a, b in zip(gens, mine):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4, rtol=1e-4)
        # request-level streaming over a feed that hands out one request at a time: the engine asks again as replies
        # arrive (refills), every request comes back once, numbered in the order the feed gave them
        todo, asked = list(range(5)), []

        def feed(free):
            asked.append(free)
            return [(prompts[i % 3], 6) for i in (todo.pop(0) for _ in range(min(free, 1, len(todo))))]

        got = dict(eng.generate_stream(feed, max_inflight=2))
        assert sorted(got) == list(range(5)) and not todo
        assert all(g.weight_version == 3 and 0 < len(g.token_ids) <= 6 for g in got.values())
        assert asked[-1] == 2  # it ended once nothing was in flight and the feed had nothing
        # sleep / wake (colocated schedule): paused while asleep, woken with a new version
        assert eng.sleep() == 0
        with pytest.raises(RuntimeError, match="asleep"):
            eng.generate(prompts, 2)
        eng.wake(state, 4)
        assert eng.server_weight_version() == "4" and eng.generate(prompts[:1], 2)[0].weight_version == 4
        # a dead server is a dead engine
        pid = eng.server.pid
        eng.server.stop()
        with pytest.raises(EngineDied, match=f"pid {pid}"):
            eng.generate(prompts, 2)
    finally:
        eng.close()


def test_watchdog_ends_the_server_when_its_parent_is_killed(tmp_path):
    """A Rollout process killed by SIGKILL with its process group (ray.kill, Ray shutdown) leaves no engine
    server behind."""
    script = (
        "import sys, time; from relax.engines.remote import OwnedServer; "
        "s = OwnedServer([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); time.sleep(600)'], "
        f"'http://x', {str(tmp_path / 'log')!r}); print(s.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    parent.stdout.readline()
    log = tmp_path / "log"
    import time

    deadline = time.time() + 120  # the child Python's start-up: seconds on a quiet machine, far more on a loaded one
    while time.time() < deadline and not (log.exists() and log.read_text().strip()):
        time.sleep(0.1)
    server_pid = int(log.read_text().split()[0])
    os.killpg(parent.pid, 9)  # the parent's whole process group, as when Ray ends a worker
    parent.wait()
    deadline = time.time() + 60  # the watchdog sees its parent gone within a poll; load can delay it
    while time.time() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(server_pid, 9)
        pytest.fail("the server outlived its killed parent")


def test_engine_config_checks():
    with pytest.raises(ValueError, match="rollout.engine_urls"):
        _cfg("rollout.engine=torch_http", 'rollout.engine_urls=["http://127.0.0.1:1", "http://127.0.0.1:2"]')
    with pytest.raises(ValueError, match="rollout.engine_urls"):
        _cfg('rollout.engine_urls=["http://127.0.0.1:1"]')  # engine torch: nothing to connect to
    cfg = _cfg("rollout.engine=sglang", 'rollout.engine_urls=["http://127.0.0.1:1"]')
    assert cfg.rollout.engine_urls == ["http://127.0.0.1:1"]
    check_engine_available(cfg)  # external engines need no local sglang
    omni = ROOT / "experiments/omni/cpu.yaml"
    with pytest.raises(ValueError, match="rollout.engine"):
        load_config(omni, ["rollout.engine=torch_http"])
    with pytest.raises(RuntimeError, match="rollout.engine: 'sglang' generates text only"):
        check_engine_available(load_config(omni, ["rollout.engine=sglang"]))
    if not sglang_available():
        with pytest.raises(RuntimeError, match="sglang package is not importable"):
            check_engine_available(_cfg("rollout.engine=sglang"))


@pytest.mark.slow
def test_external_engine_by_url():
    from relax.engines.http_server import launch_torch_server

    cfg = _cfg("rollout.engine=torch_http")
    srv = launch_torch_server(json.loads(json.dumps(cfg.model.model_dump())), seed=1)
    try:
        cfg = _cfg("rollout.engine=torch_http", f'rollout.engine_urls=["{srv.url}"]')
        eng = make_remote_engine(cfg, 0, health_timeout=30)
        assert eng.server is None  # connected, not launched
        model, tok = build_model(cfg.model, 5)
        eng.update_weights({n: p.detach() for n, p in model.named_parameters()}, 2)
        assert eng.generate([tok.encode("1+1")], 3)[0].weight_version == 2
        eng.close()
        assert srv.proc.poll() is None  # an external engine is not ours to stop
    finally:
        srv.stop()


@pytest.mark.slow
def test_async_torch_http_dead_server_restarts_the_replica(torch_http_run):
    """The engine server of the (only) Rollout replica is SIGKILLed mid-run, while it holds a version that leaves
    the last partition still to generate (tests/conftest.py): the replica exits, Tier 1 restarts it with a fresh
    server, and the run trains every sample once. The 6-step run is shared with tests/test_e2e.py and
    tests/test_cluster_network.py."""
    run = torch_http_run
    assert run.killed, f"the engine server was never seen at a version in the kill window (seen: {run.versions})"
    assert run.killed.version <= run.steps - 3
    assert run.returncode == 0, run.log[-4000:]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["samples_trained"] == 6 * 16
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    rec = json.loads((run.run_dir / "recovery.json").read_text())
    assert [(e["role"], e["tier"]) for e in rec["events"]] == [("rollout", 1)], \
        f"killed pid {run.killed.pid} at version {run.killed.version}; log: {run.log[-3000:]}"
