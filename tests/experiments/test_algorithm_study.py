"""The algorithm-comparison study (experiments/algorithms/study.py, drawn by analysis/algorithms.py): its configs are valid, and its drawer turns a study
folder into the table and figure (no runs here: a small study folder is written by hand)."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from analysis.algorithms import END_STEPS, START_STEPS, draw_algorithms, reward_window
from analysis.reproduce import STUDIES
from experiments.algorithms.study import ALGORITHMS
from relax.algorithms import check_config
from relax.config import load_config
from relax.schedules import role_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_config_is_valid(name, tmp_path):
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [f"profile=cpu-{name}", *ALGORITHMS[name][1]])
    check_config(cfg.algorithm)
    names = role_names(cfg)
    assert ("critic" in names) == (name == "ppo_critic") and ("teacher" in names) == (name == "opd")


def test_study_is_wired_into_reproduce():
    assert ("algorithms", ["study", "algorithms"]) in STUDIES


def test_reward_window():
    rewards = [0.0] * START_STEPS + [0.5] * 20 + [1.0] * END_STEPS
    assert reward_window(rewards) == (0.0, 1.0)


def _fake_run(root: Path, name: str, rewards: list[float]) -> str:
    run = root / "runs" / "async" / f"cpu-{name}" / "r0"
    run.mkdir(parents=True)
    cfg = load_config(ROOT / "experiments/async/cpu.yaml", [f"profile=cpu-{name}", *ALGORITHMS[name][1]])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump()))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": r}) + "\n"
                                               for i, r in enumerate(rewards)))
    return str(run.relative_to(root))


def test_drawer_writes_table_and_figure(tmp_path):
    assert draw_algorithms(tmp_path, tmp_path / "figures", tmp_path / "tables") == []  # no study: nothing
    root = tmp_path / "algorithms"
    algs = {}
    for name, gain in (("grpo", 0.2), ("sapo", -0.1)):
        rewards = [0.5] * 10 + [0.5 + gain] * 10
        start, end = reward_window(rewards)
        algs[name] = {"label": ALGORITHMS[name][0], "overrides": ALGORITHMS[name][1], "steps": 20,
                      "run": _fake_run(root, name, rewards), "reward_start": start, "reward_end": end,
                      "eval_reward_start": 0.5, "eval_reward_end": 0.5 + gain / 2, "eval_accuracy_start": 0.9,
                      "eval_accuracy_end": 0.95, "mean_step_time_s": 1.0, "train_time_s": 20.0,
                      "load_before": [3.0, 2.0, 1.0]}
    (root / "algorithms.json").write_text(json.dumps({"algorithms": algs}))
    written = draw_algorithms(tmp_path, tmp_path / "figures", tmp_path / "tables")
    assert {p.name for p in written} == {"algorithms.csv", "algorithms.md", "algorithms.png"}
    assert all(p.stat().st_size > 0 for p in written)
    rows = {r["algorithm"]: r for r in csv.DictReader(open(tmp_path / "tables" / "algorithms.csv"))}
    assert float(rows["grpo"]["reward_gain"]) == pytest.approx(0.2)
    assert float(rows["sapo"]["reward_gain"]) == pytest.approx(-0.1)
    assert rows["sapo"]["overrides"] == "algorithm.policy_loss=sapo"
    assert "128 samples" in (tmp_path / "tables" / "algorithms.md").read_text()  # 16 prompts x 8, from the config


def test_update_reference_keeps_the_hand_measured_smollm2_folder(tmp_path):
    from analysis import reproduce

    out, ref = tmp_path / "results", tmp_path / "results" / "reference"
    (ref / "smollm2").mkdir(parents=True)
    (ref / "smollm2" / "summary.json").write_text("{}")
    (ref / "async" / "cpu" / "old").mkdir(parents=True)
    (ref / "README.md").write_text("old")
    reproduce.update_reference([], out, ref)
    assert (ref / "smollm2" / "summary.json").exists() and not (ref / "async").exists()
    assert (ref / "README.md").read_text() != "old"


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
