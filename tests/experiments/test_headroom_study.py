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
