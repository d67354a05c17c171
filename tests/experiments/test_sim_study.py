"""`relax study sim` (experiments/sim/study.py) on a small spec, drawn by analysis/sim.py: the predictions sit
beside the published values, and every table and figure is labelled SIMULATED."""

from __future__ import annotations

import argparse
import json

import yaml

from analysis.published import value
from analysis.sim import draw_sim
from experiments.sim import study

SPEC = {
    "hardware": "h800", "steps": 3, "recompute": True, "engine": {"inflight": "share", "stream": True},
    "length_bands": ["low", "mid", "high"],
    "gate": [
        {"name": "colocate", "config": "experiments/colocate/h800x16.yaml", "overrides": [],
         "published": ["text_modes", "relax", "colocate", "step_time"]},
        {"name": "async_off_policy", "config": "experiments/async/h800x16.yaml", "overrides": ["max_staleness=1"],
         "published": ["text_modes", "relax", "async_off_policy", "step_time"]}],
    "ratios": [["async off-policy vs colocate", "colocate", "async_off_policy",
                ["text_modes", "relax", "async_off_policy", "speedup_vs_colocate"]]],
    "as_built": ["async_off_policy"],
    "max_length": {"tokens": [4096, 8192], "gate": ["colocate", "async_off_policy"], "steps": 3},
}


def test_small_study_is_drawn_simulated_beside_published(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    args = argparse.Namespace(spec=str(spec), out=str(tmp_path), only=["gate", "max_length"])
    assert study.main(args) == 0
    res = json.loads((tmp_path / "sim" / "sim_results.json").read_text())
    assert res["simulated"] is True
    g = res["gate"]["async_off_policy"]
    assert g["published"] == value("text_modes", "relax", "async_off_policy", "step_time")
    lo, mid, hi = (g["bands"][b]["step_time_s"] for b in ("low", "mid", "high"))
    assert lo < mid < hi  # longer responses, longer steps
    assert 0 < g["bands"]["mid"]["effective_train_mfu"] <= g["bands"]["mid"]["assumed_train_mfu"]
    assert 0 < g["bands"]["mid"]["effective_decode_bw_efficiency"] <= 1
    assert g["as_built_mid"]["step_time_s"] > 0
    r = res["ratios"][0]
    assert r["mid"] == round(res["gate"]["colocate"]["bands"]["mid"]["step_time_s"] / mid, 3)
    files = draw_sim(tmp_path, tmp_path / "figures", tmp_path / "tables")
    names = {f.name for f in files}
    assert {"sim_gate.md", "sim_ratios.csv", "sim_gate.png", "sim_max_length.md"} <= names
    for f in files:
        if f.suffix == ".md":
            assert f.read_text().startswith("# SIMULATED")


def test_scaling_puts_partial_rollout_beside_streaming(tmp_path):
    """The scaling part simulates each async point again with partial rollout (the whole share in flight); a config
    that refuses it (R3's routing capture is not streamed) gets None, not a number."""
    spec = {**SPEC, "scaling": {"gpus": [16], "steps": 3, "models": {
        "Qwen3-4B": {"async": "experiments/async/h800x16.yaml", "colocate": "experiments/colocate/h800x16.yaml"},
        "Qwen3-30B-A3B": {"async": "experiments/r3_moe/h800x16.yaml", "colocate": "experiments/r3_moe/h800x16.yaml",
                          "colocate_overrides": ["mode=colocate", "max_staleness=0", "resources.actor.gpus=16",
                                                 "resources.rollout.gpus=16", "resources.reference.gpus=16",
                                                 "resources.actor_fwd.gpus=0", "algorithm.old_log_probs=rollout",
                                                 "rollout.replicas=4"]}}}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert study.main(argparse.Namespace(spec=str(path), out=str(tmp_path), only=["scaling"])) == 0
    rows = {r["model"]: r for r in json.loads((tmp_path / "sim" / "sim_results.json").read_text())["scaling"]}
    dense, moe = rows["Qwen3-4B"], rows["Qwen3-30B-A3B"]
    assert dense["async_partial_step_s"] > 0
    assert dense["partial_speedup"] == round(dense["async_step_s"] / dense["async_partial_step_s"], 3)
    assert moe["async_partial_step_s"] is None and moe["partial_speedup"] is None


def test_staleness_sweep_puts_streaming_alone_beside_partial_rollout(tmp_path):
    """The staleness sweep's ablation: chunked claims, streaming that refills (its engine drains before it loads a
    new version) and streaming + partial rollout at each s, a line per engine in the figure. At s = 0 a partition
    starts only once the last is trained: no version ever arrives mid-request, so the two streaming columns agree."""
    spec = {**SPEC, "staleness": {"config": "experiments/async/h800x16.yaml", "s": [0, 1], "gpus": [16], "steps": 6}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert study.main(argparse.Namespace(spec=str(path), out=str(tmp_path), only=["staleness"])) == 0
    rows = {r["max_staleness"]: r for r in json.loads((tmp_path / "sim" / "sim_results.json").read_text())["staleness"]}
    assert rows[0]["streaming_step_s"] == rows[0]["streaming_partial_step_s"] > 0
    assert rows[1]["streaming_step_s"] > 0 and rows[1]["streaming_partial_step_s"] > 0
    from analysis.sim import _staleness_series

    engines = {r["engine"] for r in _staleness_series(list(rows.values()))}
    assert engines == {"16 GPUs, chunked", "16 GPUs, streaming", "16 GPUs, streaming+partial"}


def test_the_cpu_gate_sums_bus_calls_over_processes_and_prints_them_beside_the_simulated_kinds():
    """experiments/sim/gate_cpu.py: summary.json's bus_calls_per_step (by process) summed by kind; the bus table
    puts the model's calls and empty lookups beside them, and every process group lands in exactly one column."""
    from experiments.sim import gate_cpu

    by_process = {"driver": {}, "reward": {"fetch": 4.0, "empty_fetch": 8.0, "wait": 8.0, "write": 4.0},
                  "rollout-0": {"put": 4.0}, "actor": {"fetch": 1.5, "empty_fetch": 0.25, "wait": 0.25}}
    assert gate_cpu.bus_calls(by_process) == {"put": 4.0, "write": 4.0, "fetch": 5.5, "empty_fetch": 8.25,
                                               "wait": 8.25}
    assert gate_cpu.bus_calls(None) is None
    assert gate_cpu.group_cpu({"ray::ActorRole": 0.25, "ray::Coordinator": 0.125, "ray::GroupQueue": 0.0625,
                               "ray::DCSCoordinator": 0.03125, "driver": 0.5, "gcs_server": 1.0}) == \
        {"roles": 0.25, "bus": 0.1875, "DCS": 0.0312, "driver": 0.5, "Ray and the rest": 1.0}
    row = {"run": "async/cpu", "median": {"measured_s": 0.5, "predicted_s": 0.45, "error": -0.1},
           "mean": {"measured_s": 0.5, "predicted_s": 0.45, "error": -0.1}, "host_load": [1.0, 2.0],
           "bus_calls_per_step": gate_cpu.bus_calls(by_process),
           "simulated_bus_calls_per_step": {"call": 17.0, "empty_fetch": 3.5}}
    rat = {"median": [], "mean": []}
    text = gate_cpu.markdown([row], rat, [], "runs")
    assert "| async/cpu | 4.0 | 4.0 | 5.5 | 8.25 | 8.25 | 17.0 | 3.5 |" in text
    assert "SIMULATED" in text.splitlines()[0]
    assert "profile after" not in text
    # --fresh: the runs priced again by profiles taken after them, beside the first take
    after = {**row, "median": {"measured_s": 0.5, "predicted_s": 0.55, "error": 0.1}}
    ratio = {"ratio": "async / colocate", "measured": 1.2, "predicted": 1.08, "error": -0.1}
    text = gate_cpu.markdown([row], rat, [], "runs", {"runs": [after], "ratios": [ratio]})
    assert "| async/cpu | 0.4500 | -10.0% | 0.5500 | +10.0% |" in text
    assert "| ratio: async / colocate | | | 1.080 | -10.0% |" in text
