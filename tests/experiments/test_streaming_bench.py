"""`relax bench streaming` (experiments/streaming/bench.py): both ways generate the same tokens on the engine, and
the real-run pairs alternate their order with the step-time ratio taken within each pair."""

from __future__ import annotations

import argparse
import json

from experiments.streaming import bench


def _args(tmp_path, runs):
    ap = argparse.ArgumentParser()
    bench.add_arguments(ap)
    return ap.parse_args(["--groups", "2", "--group-size", "2", "--chunk-groups", "1", "--mean", "4", "--max", "8",
                          "--rounds", "1", "--runs", str(runs), "--run-steps", "2", "--out", str(tmp_path / "b.json")])


def test_both_ways_generate_the_same_tokens(tmp_path):
    assert bench.main(_args(tmp_path, 0)) == 0
    out = json.loads((tmp_path / "b.json").read_text())
    tokens = {w: {r["tokens"] for r in out["runs"][w]} for w in ("chunked", "continuous")}
    assert tokens["chunked"] == tokens["continuous"] and len(tokens["chunked"]) == 1  # EOS is never sampled
    assert "real_runs" not in out


def test_real_run_pairs_alternate_and_take_the_ratio_within_each_pair(tmp_path, monkeypatch):
    import relax.controller

    order = []

    def fake_run(cfg, out, run, progress):
        way = "continuous" if cfg.rollout.max_inflight else "chunked"
        order.append(way)
        assert cfg.steps == 2 and cfg.rollout.max_new_tokens == 64
        assert cfg.rollout.max_inflight in (None, cfg.rollout.chunk_groups * cfg.rollout.group_size)
        pair = int(run.split("-")[1])
        step = (1.0 + pair) * (1.5 if way == "continuous" else 1.0)  # pair 1 ran twice as slow for both ways
        run_dir = tmp_path / run
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text(json.dumps({"tokens": 30, "samples": 10}) + "\n")
        return run_dir, {"mean_step_time_s": step, "tokens_per_s": 100 / step, "trainer_wait_share": 0.1,
                         "samples_lost": 0, "samples_duplicated": 0}

    monkeypatch.setattr(relax.controller, "run_experiment", fake_run)
    args = _args(tmp_path, 2)
    args.runs = 2
    e2e = bench.real_runs(args)
    assert order == ["chunked", "continuous", "continuous", "chunked"]
    assert e2e["summary"]["step_time_ratio"] == 1.5 and e2e["summary"]["chunked"]["tokens_per_sample"] == 3.0
