"""The emulated-GPU study's driver and drawer: registered as `relax study emulate`, its spec's configs load and
are priced, and analysis/emulate.py labels every number EMULATED / SIMULATED beside the published one."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from relax.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_study_is_registered_and_its_spec_prices_every_run():
    from experiments import cli
    from experiments.emulate import study
    from relax.emulate import engine_config

    assert cli.STUDIES["emulate"] == "experiments.emulate.study"
    spec = yaml.safe_load(study.SPEC.read_text())
    names = [r["name"] for r in spec["runs"]]
    assert names == ["colocate", "async_on_policy", "async_off_policy", "verl", "openrlhf"]
    for r in spec["runs"]:
        cfg = load_config(ROOT / r["config"], [*r["overrides"], "steps=2"])
        sim = study.simulate(cfg, spec)
        assert sim["simulated"] and sim["mean_step_time_s"] > 0
        assert engine_config(cfg.model_copy(update={"emulate": cfg.emulate.model_copy(
            update={"hardware": spec["hardware"]})})).emulate.target is not None


def test_drawer_writes_a_labelled_table_beside_the_published_numbers(tmp_path):
    from analysis.emulate import draw_emulate

    def run(name, em, si, published):
        return {"name": name, "published": published, "emulated_over_simulated": em / si,
                "emulated": {"mean_step_time_s": em, "trainer_wait_share": 0.005, "real_mean_step_time_s": em / 100,
                             "samples_lost": 0, "samples_duplicated": 0, "load_before": 2.0, "load_after": 2.1,
                             "run_dir": f"runs/{name}"},
                "simulated": {"mean_step_time_s": si, "trainer_wait_share": 0.004, "critical_path_s": {"train": 8.0}}}

    colocate = run("colocate", 260.0, 250.0, ["text_modes", "relax", "colocate", "step_time"])
    colocate.update(simulated_on_host={"mean_step_time_s": 280.0}, emulated_over_simulated_on_host=260.0 / 280.0)
    res = {"hardware": "h800", "compression": 100, "steps": 4,
           "runs": [colocate, run("openrlhf", 700.0, 600.0, None)], "beyond": None}
    (tmp_path / "emulate").mkdir()
    (tmp_path / "emulate" / "emulate_results.json").write_text(json.dumps(res))
    files = draw_emulate(tmp_path, tmp_path / "figures", tmp_path / "tables")
    md = next(f for f in files if f.suffix == ".md").read_text()
    assert "EMULATED" in md and "225.9" in md  # the published colocate step time, read via analysis/published.py
    csv = next(f for f in files if f.suffix == ".csv").read_text().splitlines()
    assert csv[1].split(",")[4] == "True" and csv[2].split(",")[4] == "False"  # 4% inside 10%, 17% outside
    # beside it, the host twin's prediction where the study measured it (an older results file has none)
    assert csv[0].split(",")[5:8] == ["simulated_on_host_s", "emulated/simulated_on_host", "within_10%_on_host"]
    assert csv[1].split(",")[5:8] == ["280.0", "0.929", "True"] and csv[2].split(",")[5:8] == ["", "", ""]
    assert any(f.suffix == ".png" for f in files)


def test_beyond_table_puts_the_ablation_beside_the_run(tmp_path):
    """Beyond-the-paper's table: the run against the slowest pool's bound, and beside it the same run less one
    feature (streaming alone, rollout.partial=false), with the speed-up over the gated configuration it keeps."""
    from analysis.emulate import _beyond_table
    from experiments.emulate.study import against

    bound = {"bound_step_s": 100.0, "floor_step_s": 110.0, "tradeoff_step_s": 120.0, "slowest_pool": "rollout",
             "longest_response_alone_s": 150.0, "latency_floor_s": 110.0, "limits_s": {"actor": 50.0}}
    b = {"name": "beyond", "overrides": ["rollout.partial=true"], "base": "async_off_policy", "steps": 12,
         "split": {"rollout_gpus": 8, "actor_gpus": 4}, "rollout": {"replicas": 8},
         "emulated": {"mean_step_time_s": 200.0}, "simulated": {"mean_step_time_s": 180.0, "bound": bound},
         "simulated_steady": {"steps": 30, "mean_step_time_s": 190.0, "bound": bound},
         "speedup_vs_gated_emulated": 3.0, "speedup_vs_gated_simulated": 3.5,
         **{f"share_of_{x}_{k}": 0.5 for x in ("bound", "floor")
            for k in ("emulated", "simulated", "simulated_steady")},
         "ablation": {"ablation": {"partial": False}, "emulated": {"mean_step_time_s": 250.0},
                      "simulated": {"mean_step_time_s": 225.0}}}
    gated = {"emulated": {"mean_step_time_s": 600.0}, "simulated": {"mean_step_time_s": 630.0}}
    against(b["ablation"], gated, bound)  # what the study writes beside the run (experiments/emulate/study.py)
    files = _beyond_table({"steps": 4, "beyond": b}, tmp_path)
    md = next(f for f in files if f.suffix == ".md").read_text()
    assert "| EMULATED, 12 steps, with rollout.partial=False | 250.0 | 2.4 | 0.4 | 0.44 |" in md
    assert "| SIMULATED, 12 steps, with rollout.partial=False | 225.0 | 2.8 | 0.444 | 0.489 |" in md
