"""The omni study's per-seed summary, its held-out gain with an interval, and the figure (hand-made results)."""

import json

import pytest

from analysis.omni import draw_omni, heldout_gains, omni_rows
from experiments.omni.study import mode_summary


def _run(mode, seed, start, end, step_time):
    return {"run": f"omni/cpu/{mode}-s{seed}", "mode": mode, "seed": seed, "mean_step_time_s": step_time,
            "train_time_s": 10 * step_time, "reward_start": 0.2, "reward_end": 0.4, "eval_accuracy_start": start,
            "eval_accuracy_end": end, "eval_reward_start": start, "eval_reward_end": end, "samples_lost": 0,
            "series": {"step": [0, 1], "wall_time_s": [1.0, 2.0], "step_time_s": [1.0, 1.0], "reward": [0.2, 0.4]},
            "host_load": {"loadavg_before": [1.0, 1.0, 1.0], "loadavg_after": [2.0, 1.0, 1.0]}}


def test_modes_summarise_their_seeds_and_the_table_gives_the_gain_interval(tmp_path):
    runs = {"async": [_run("async", s, 0.2, 0.2 + g, 1.0) for s, g in enumerate([0.1, 0.2, 0.3])],
            "colocate": [_run("colocate", s, 0.3, 0.3, 2.0) for s in range(3)]}
    res = {"model": {}, "task": {}, "modes": {m: mode_summary(r) for m, r in runs.items()}}
    a = res["modes"]["async"]
    assert a["seeds"] == [0, 1, 2] and a["eval_accuracy_end"] == pytest.approx(0.4)
    assert heldout_gains(a) == pytest.approx([0.1, 0.2, 0.3])
    rows = {r["metric"]: r["measured"] for r in omni_rows(res, {})}
    assert rows["async: held-out greedy accuracy gain, mean over 3 seed(s)"] == pytest.approx(0.2)
    # t(0.975, 2) = 4.303, sd 0.1: half-width 4.303 * 0.1 / sqrt(3)
    assert rows["async: held-out greedy accuracy gain, 95% t half-width"] == pytest.approx(0.248, abs=1e-3)
    assert rows["colocate: held-out greedy accuracy gain, mean over 3 seed(s)"] == 0.0
    assert rows["async speed-up vs colocate (colocate step / async step)"] == pytest.approx(2.0)
    (tmp_path / "omni").mkdir()
    (tmp_path / "omni" / "omni_results.json").write_text(json.dumps(res))
    paths = draw_omni(tmp_path, tmp_path / "figures", tmp_path / "tables")
    assert {p.name for p in paths} == {"omni.csv", "omni.md", "omni.png"}
