"""`relax bench old_log_probs` (experiments/old_log_probs/bench.py): pairs alternate their order, and the ratios
are taken within each pair (the two runs that ran back to back), then the median over pairs."""

from __future__ import annotations

from experiments.old_log_probs import bench


def _run(way, step, clip, cpu):
    return {"way": way, "step_time_s": step, "clip_frac": clip, "approx_kl": None, "logp_gap_abs": 0.01,
            "old_rollout_gap_abs": 0.005 if way == "actor_fwd" else None, "old_log_probs_exact_share": None,
            "cpu_per_step_s": cpu, "actor_fwd_cpu_per_step_s": 0.2 if way == "actor_fwd" else None,
            "host_load": "0.1 -> 0.2"}


def test_ratios_are_within_pairs_then_the_median():
    # pair 0 ran on a quiet machine, pair 1 twice as slow for both ways: within-pair ratios are 1.1 and 1.2
    runs = [_run("rollout", 1.0, 0.010, 2.0), _run("actor_fwd", 1.1, 0.004, 2.2),
            _run("actor_fwd", 2.4, 0.006, 4.8), _run("rollout", 2.0, 0.010, 4.0),
            _run("rollout", 1.0, 0.010, 2.0), _run("actor_fwd", 1.3, 0.005, 2.6)]
    s = bench.summarise(runs)
    assert s["step_time_ratio"] == 1.2 and s["cpu_ratio"] == 1.2  # median of 1.1, 1.2, 1.3
    assert s["clip_frac_ratio"] == 0.5
    assert s["approx_kl_ratio"] is None  # not recorded: no ratio, not a made-up one
    assert s["median"]["rollout"]["old_rollout_gap_abs"] is None
    assert s["median"]["actor_fwd"]["old_rollout_gap_abs"] == 0.005


def test_pairs_alternate_which_way_runs_first(monkeypatch, tmp_path):
    order = []

    def fake_one(config, way, overrides, out, name, steps):
        order.append(way)
        assert "rollout.dtype=bfloat16" in overrides  # the default mismatch: a bf16 engine, an fp32 trainer
        return _run(way, 1.0, 0.01, 2.0)

    monkeypatch.setattr(bench, "one", fake_one)
    args = type("A", (), {"config": "c.yaml", "pairs": 3, "steps": 2, "out": str(tmp_path / "b.json"),
                          "overrides": []})()
    assert bench.main(args) == 0
    assert order == ["rollout", "actor_fwd", "actor_fwd", "rollout", "rollout", "actor_fwd"]
    assert '"step_time_ratio": 1.0' in (tmp_path / "b.json").read_text()
