"""The head-room benchmark (experiments/headroom/study.py, tabled by analysis/headroom.py): its configs are valid
and disjoint per seed, the study is a `relax study` verb, and the table's interval is the Student-t one (no runs
here: a small study folder is written by hand; the gains themselves come only from real runs)."""

import csv
import json
from pathlib import Path

import pytest

from analysis.headroom import headroom_rows, interval, write_headroom
from experiments.cli import STUDIES
from experiments.headroom.study import CONFIG, RUNS, SEEDS
from relax.config import load_config
from relax.preflight import preflight
from relax.tasks import make_task

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(RUNS))
def test_every_variant_passes_preflight(name):
    preflight(load_config(ROOT / CONFIG, [f"profile=cpu-{name}", *RUNS[name][1]]))


def test_held_out_prompts_are_never_trained_on():
    cfg = load_config(ROOT / CONFIG, ["task.size=400"])
    assert cfg.task.exclude_eval_questions
    train = {p.question for p in make_task(cfg.task, cfg.seed, "train")}
    held_out = {p.question for p in make_task(cfg.task, cfg.seed, "eval")}
    assert held_out and train and not train & held_out


def test_without_the_exclusion_a_small_task_repeats_eval_questions_in_training():
    cfg = load_config(ROOT / CONFIG, ["task.size=400", "task.exclude_eval_questions=false"])
    train = {p.question for p in make_task(cfg.task, cfg.seed, "train")}
    assert train & {p.question for p in make_task(cfg.task, cfg.seed, "eval")}


def test_study_is_a_relax_study_verb():
    assert STUDIES["headroom"] == "experiments.headroom.study" and len(SEEDS) >= 3


def test_interval_is_student_t():
    mean, half = interval([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.302653 * 0.1 / 3**0.5, rel=1e-5)
    assert interval([0.4]) == (0.4, None)


def test_table_has_a_row_per_seed_and_a_mean_with_its_interval(tmp_path):
    assert write_headroom(tmp_path, tmp_path / "tables") == []  # no study: nothing
    runs = {f"grpo/seed{s}": {"variant": "grpo", "seed": s, "steps": 10, "eval_size": 8, "eval_accuracy_start": 0.4,
                              "eval_accuracy_end": 0.4 + g, "train_time_s": 60.0, "tokens_per_s": 100.0,
                              "load_before": [3.0, 2.0, 1.0]} for s, g in ((0, 0.1), (1, 0.2), (2, 0.3))}
    (tmp_path / "headroom").mkdir()
    (tmp_path / "headroom" / "headroom.json").write_text(json.dumps({"runs": runs}))
    rows = headroom_rows({"runs": runs})
    assert [r["seed"] for r in rows] == [0, 1, 2, None]
    assert rows[-1]["gain"] == pytest.approx(0.2) and rows[-1]["gain_ci95"] == f"+-{interval([0.1, 0.2, 0.3])[1]:.4f}"
    csv_path, md = write_headroom(tmp_path, tmp_path / "tables")
    assert len(list(csv.DictReader(csv_path.open()))) == 4 and "95%" in md.read_text()


def test_sets_name_defined_variants_and_full_covers_every_builtin_algorithm():
    from experiments.headroom.study import SETS
    from relax.algorithms.registry import get_advantage, get_policy_loss, known_advantages, known_policy_losses

    assert set(SETS["default"]) <= set(SETS["full"]) and set(SETS["full"]) | set(SETS["convergence"]) == set(RUNS)
    # the convergence set changes the mode only: GRPO throughout
    assert all(o.split("=")[0] in ("mode", "max_staleness") for n in SETS["convergence"] for o in RUNS[n][1])
    chosen = {o.split("=", 1)[1] for _, ov in RUNS.values() for o in ov
              if o.startswith(("algorithm.advantage=", "algorithm.policy_loss="))}
    # built-ins only: other test modules register their own examples in the same registry (tests/algorithms)
    builtin = {n for n in known_advantages() if get_advantage(n).__module__.startswith("relax.")}
    builtin |= {n for n in known_policy_losses() if get_policy_loss(n).__module__.startswith("relax.")}
    assert len(builtin) >= 15 and builtin <= chosen | {"grpo", "ppo"}, builtin - chosen


def _parsed(argv):
    import argparse

    from experiments.headroom import study

    p = argparse.ArgumentParser()
    study.add_arguments(p)
    return p.parse_args(argv)


def test_row_runs_the_overrides_as_one_new_variant(monkeypatch, tmp_path):
    from experiments.headroom import study

    seen = {}
    monkeypatch.setattr(study, "run_study", lambda config, seeds, names, out, steps, extra, parallel:
                        seen.update(names=names, extra=extra, label=study.RUNS[names[0]]) or out / "x.json")
    monkeypatch.setattr(study, "write_headroom", lambda *a: [])
    monkeypatch.setattr(study, "RUNS", dict(study.RUNS))
    study.main(_parsed(["--row", "mine", "algorithm.policy_loss=reinforce", "--out", str(tmp_path)]))
    assert seen["names"] == ["mine"] and seen["extra"] == []
    assert seen["label"] == ("user: algorithm.policy_loss=reinforce", ["algorithm.policy_loss=reinforce"])


def test_row_refuses_a_builtin_name_or_no_overrides(tmp_path):
    from experiments.headroom import study

    with pytest.raises(SystemExit, match="built-in"):
        study.main(_parsed(["--row", "grpo", "algorithm.policy_loss=reinforce"]))
    with pytest.raises(SystemExit, match="needs the key=value"):
        study.main(_parsed(["--row", "mine"]))


def test_convergence_table_says_whether_each_mode_reaches_the_first_modes_accuracy(tmp_path):
    from analysis.headroom import convergence_rows, draw_headroom

    def runs(name, ends, wall):
        curve = lambda end: [{"version": 0, "wall_time_s": 0.0, "accuracy": 0.3},  # noqa: E731
                             {"version": 4, "wall_time_s": wall, "accuracy": end}]
        return {f"{name}/seed{s}": {"variant": name, "seed": s, "steps": 4, "eval_size": 8, "run": f"runs/{name}{s}",
                                    "eval_accuracy_start": 0.3, "eval_accuracy_end": e, "train_time_s": wall,
                                    "tokens_per_s": 10.0, "eval_curve": curve(e)} for s, e in enumerate(ends)}

    results = {**runs("grpo", [0.50, 0.55, 0.60], 100.0), **runs("async_s1", [0.52, 0.56, 0.58], 60.0),
               **runs("async_s4", [0.10, 0.11, 0.12], 50.0),
               **{k: {**v, "overrides": ["algorithm.advantage=rloo"]}  # an algorithm row: not a mode
                  for k, v in runs("rloo", [0.5, 0.5, 0.5], 90.0).items()},
               "old/seed0": {"variant": "old", "seed": 0, "run": "runs/old0", "eval_accuracy_start": 0.3,
                             "eval_accuracy_end": 0.3}}
    by_variant: dict = {}
    for r in results.values():
        by_variant.setdefault(r["variant"], []).append(r)
    rows = convergence_rows(by_variant)
    assert [r["variant"] for r in rows] == ["grpo", "async_s1", "async_s4"]  # no curve, or not a mode: not in it
    assert [r["overlaps_first"] for r in rows] == ["yes", "yes", "no"]
    assert rows[1]["accuracy_end"] == pytest.approx(0.5533, abs=1e-4) and rows[1]["train_time_s"] == 60
    # drawn from a study folder whose run folders are gone: the curves still come from headroom.json
    (tmp_path / "headroom").mkdir()
    (tmp_path / "headroom" / "headroom.json").write_text(json.dumps({"runs": {
        k: {**v, "steps": 4, "eval_size": 8, "train_time_s": 1.0, "tokens_per_s": 1.0} for k, v in results.items()}}))
    written = draw_headroom(tmp_path, tmp_path / "figures", tmp_path / "tables")
    names = {Path(p).name for p in written}
    assert {"headroom-convergence.md", "headroom-convergence.png", "headroom.png"} <= names
