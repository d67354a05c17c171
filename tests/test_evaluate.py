"""relax/evaluate.py (`relax evaluate`): evaluate_run scores a run's start (warm-up) and final weights on the held-out split."""

from pathlib import Path

from relax.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_evaluate_run_scores_start_and_final_weights(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from relax.config import dump_config
    from relax.evaluate import evaluate_run, greedy_accuracy
    from relax.models import build_model, state_dict_cpu
    from relax.models.warmup import warmup_state

    monkeypatch.setenv("RELAX_CACHE", str(tmp_path / "cache"))
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", ["warmup.steps=3", "task.eval_size=4", "model.hidden_size=32",
                                                            "model.intermediate_size=64", "model.num_layers=1"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    untrained = state_dict_cpu(build_model(cfg.model, cfg.seed + 1)[0])  # other weights than the start
    save_file({k: v.contiguous() for k, v in untrained.items()}, str(run / "final_weights.safetensors"))
    res = evaluate_run(run)
    assert res["eval_size"] == 4 and set(res) == {"eval_size", "eval_accuracy_start", "eval_accuracy_end"}
    assert res["eval_accuracy_start"] == greedy_accuracy(cfg, warmup_state(cfg, progress=False))
    assert res["eval_accuracy_end"] == greedy_accuracy(cfg, untrained)
    # which weights each key scored: a stand-in accuracy that fingerprints the state it is given
    import relax.evaluate as ev

    fingerprint = lambda cfg, state: float(state["model.norm.weight"].sum() + state["lm_head.weight"][0, 0])  # noqa: E731
    monkeypatch.setattr(ev, "greedy_accuracy", fingerprint)
    monkeypatch.setattr(ev, "sampled_reward", lambda cfg, state: -fingerprint(cfg, state))
    res = evaluate_run(run, sampled=True, eval_size=2)
    start = warmup_state(cfg, progress=False)
    assert res["eval_size"] == 2
    assert res["eval_accuracy_start"] == fingerprint(cfg, start) == -res["eval_reward_start"]
    assert res["eval_accuracy_end"] == fingerprint(cfg, untrained) == -res["eval_reward_end"]
    assert res["eval_accuracy_start"] != res["eval_accuracy_end"]
