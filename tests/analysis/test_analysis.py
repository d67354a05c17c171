"""Analysis: figures and tables from a small results fixture (tiny real runs of every system and the
staleness sweep, tests/fixtures/analysis/), the critical-path arithmetic on a hand-made trace, and
`relax report`. Fast: no Ray."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis import critical_path, figures, report
from analysis.results import staleness_runs, system_of, system_runs
from relax.run_folder import find_runs
from relax.schedules import spans as S

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analysis"
SYSTEM_KEYS = ["colocate", "async_on_policy", "async_off_policy", "verl", "openrlhf"]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    dest = tmp_path_factory.mktemp("drawn")
    return dest, figures.draw_all(FIXTURE, dest)


def test_fixture_holds_every_system_and_the_sweep():
    assert list(system_runs(FIXTURE)) == SYSTEM_KEYS
    assert list(staleness_runs(FIXTURE)) == [0, 1, 2, 4]


def test_draw_all_writes_every_figure_and_table(drawn):
    dest, written = drawn
    pngs = {p.name for p in (dest / "figures").glob("*.png")}
    assert pngs == {"systems_step_time.png", "reward_curves.png", "critical_path_gantt.png",
                    "critical_path_breakdown.png", "staleness_sweep.png"}
    for png in (dest / "figures").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    for name in ("systems", "ratios", "modes", "critical_path", "staleness"):
        assert (dest / "tables" / f"{name}.csv").exists() and (dest / "tables" / f"{name}.md").exists()
    assert set(written) >= set((dest / "figures").glob("*.png"))


def test_tables_put_measured_beside_published_with_both_hardwares(drawn):
    dest, _ = drawn
    ratios = pd.read_csv(dest / "tables" / "ratios.csv")
    pub = dict(zip(ratios["speed-up"], ratios["published (x)"]))
    assert pub["relax async on-policy vs colocate"] == 1.12
    assert pub["relax async off-policy vs colocate"] == 1.76
    assert pub["relax async vs veRL (emulated)"] == 1.20
    assert pd.isna(pub["relax async vs OpenRLHF (emulated)"])  # the paper has no OpenRLHF number
    assert (ratios["measured, step time (x)"] > 0).all()
    assert ratios["measured on"].str.contains("2-core CPU").all()
    systems = pd.read_csv(dest / "tables" / "systems.csv")
    assert list(systems.system) == ["relax colocate", "relax async on-policy", "relax async off-policy",
                                    "veRL (emulated)", "OpenRLHF (emulated)"]
    assert list(systems.emulated) == [False, False, False, True, True]
    assert systems.loc[systems.system == "veRL (emulated)", "published_step_time_s"].item() == 150.5
    md = (dest / "tables" / "ratios.md").read_text()
    assert "16xH800" in md and "2-core CPU" in md and "EMULATED" in md


def test_critical_path_table_names_the_sync_points(drawn):
    dest, _ = drawn
    cp = pd.read_csv(dest / "tables" / "critical_path.csv").set_index("system")
    assert cp.loc["veRL (emulated)", f"{S.REFERENCE} (s)"] > 0
    assert cp.loc["veRL (emulated)", f"{S.OLD_LOGPROB} (s)"] > 0
    assert cp.loc["relax async off-policy", f"{S.OLD_LOGPROB} (s)"] == 0  # relax keeps them off the path
    assert cp.loc["veRL, published (16xH800)", f"{S.WAIT_ROLLOUT} (s)"] == 38.2
    assert cp.loc["veRL, published (16xH800)", f"{S.REFERENCE} (s)"] == 27.3
    assert cp.loc["relax async, published (16xH800)", f"{S.WAIT_ROLLOUT} (s)"] == 0.11


def test_breakdown_of_a_hand_made_step():
    trace = pd.DataFrame([
        # role, name, step, start, end
        ("actor", "rollout_residual", 0, 0.0, 1.0),
        ("actor", "weight_sync_barrier", 0, 1.0, 1.5),
        ("actor", "old_logprob", 0, 1.5, 2.0),
        ("actor", "ref_forward", 0, 2.0, 3.0),
        ("actor", "train_micro_batch", 0, 3.0, 4.0),
        ("actor", "weight_publish", 0, 4.5, 5.0),  # 4.0-4.5: no span (idle)
        ("rollout", "generate", 1, 1.5, 4.0),  # other lanes never count
        ("actor", "train_micro_batch", 1, 5.0, 9.0),  # clipped to the window
    ], columns=["role", "name", "step", "start", "end"])
    b = critical_path.breakdown(trace, 0.0, 6.0)
    assert b == pytest.approx({S.WAIT_ROLLOUT: 1.0, S.IDLE: 0.5, S.REFERENCE: 1.0, S.OLD_LOGPROB: 0.5,
                               S.TRAIN: 2.0, S.WEIGHT_SYNC: 1.0, S.OTHER: 0.0})
    assert sum(b.values()) == pytest.approx(6.0)


def test_system_of_classifies_runs_from_their_summary():
    assert system_of({"mode": "colocate", "max_staleness": 0}) == "colocate"
    assert system_of({"mode": "async", "max_staleness": 0}) == "async_on_policy"
    assert system_of({"mode": "async", "max_staleness": 2}) == "async_off_policy"
    assert system_of({"mode": "async", "max_staleness": 1, "schedule": "verl"}) == "verl"


def test_report_against_published(capsys):
    from relax.cli import main

    runs = system_runs(FIXTURE)
    assert main(["report", str(runs["async_off_policy"]), str(runs["verl"]), str(runs["colocate"]),
                 "--against", "published"]) == 0
    out = capsys.readouterr().out
    assert "relax async off-policy" in out and "veRL (emulated)" in out and "16xH800" in out
    df = report.report_table([runs["async_off_policy"], runs["verl"], runs["colocate"]], against="published")
    assert list(df["published step time (s, 16xH800)"]) == [125.6, 150.5, 225.9]
    assert list(df["speed-up vs first run, published (x)"]) == [1.0, 0.835, 0.569]  # >1: faster than the first
    m = df["speed-up vs first run, this table (x)"]
    assert m.iloc[0] == 1.0 and (m > 0).all()
    for col in ("steps/hour", "step time (s)", "reward start", "reward end", "eval acc end", "max staleness",
                "pipeline efficiency"):
        assert df[col].notna().all(), col


def test_report_takes_folders_and_csv(capsys, tmp_path):
    from relax.cli import main

    assert len(find_runs([FIXTURE])) == 7
    assert main(["report", str(FIXTURE / "async"), "--format", "csv"]) == 0
    df = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    assert len(df) == 6 and "OpenRLHF (emulated)" in set(df.system)
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_figures_cli_redraws_from_a_copy(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    # A run without a trace still gets every other figure.
    for trace in src.glob("async/cpu-verl/*/trace.json"):
        trace.unlink()
    from relax.cli import main

    assert main(["figures", "--source", str(src), "--dest", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figures" / "systems_step_time.png").exists()
    cp = pd.read_csv(tmp_path / "out" / "tables" / "critical_path.csv")
    assert "veRL (emulated)" not in set(cp.system)
    assert json.loads((src / "async/cpu/fixture/summary.json").read_text())["schedule"] == "relax"


def test_update_reference_copies_small_files_only(tmp_path):
    from analysis import reference, reproduce

    out, ref = tmp_path / "results", tmp_path / "results" / "reference"
    run = out / "async" / "cpu" / "r1"
    shutil.copytree(FIXTURE / "async" / "cpu" / "fixture", run)
    (run / "final_weights.safetensors").write_bytes(b"\0" * 1000)
    big = out / "async" / "cpu-verl" / "r2"
    shutil.copytree(FIXTURE / "async" / "cpu-verl" / "fixture", big)
    (big / "trace.json").write_text(" " * (reference.MAX_FILE_BYTES + 1))
    reproduce.update_reference([run, big], out, ref)
    assert sorted(p.name for p in (ref / "async/cpu/r1").iterdir()) == sorted(
        n for n in reference.RUN_FILES if (run / n).exists())
    assert not (ref / "async/cpu-verl/r2/trace.json").exists()  # too big: figures without its Gantt panel
    assert (ref / "async/cpu-verl/r2/summary.json").exists()
    assert [e[0] for e in reproduce.EXPERIMENTS] == ["colocate", "async-on-policy", "async-off-policy",
                                                    "verl-emulated", "openrlhf-emulated", "staleness-2",
                                                    "staleness-4"]


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


def test_update_reference_keeps_a_table_measured_by_its_own_command(tmp_path):
    """reproduce-fig runs the head-room study's small set (GRPO, one seed); the committed 20-row table stays."""
    from analysis import reproduce

    out, ref = tmp_path / "results", tmp_path / "results" / "reference"
    assert ("headroom", ["study", "headroom", "--seeds", "0"]) in reproduce.STUDIES
    assert "headroom" in reproduce.KEPT_REFERENCE
    (ref / "headroom").mkdir(parents=True)
    (ref / "headroom" / "headroom.json").write_text('{"runs": {"table": 1}}')
    (out / "headroom").mkdir(parents=True)
    (out / "headroom" / "headroom.json").write_text('{"runs": {"grpo": 1}}')
    (out / "r3_moe").mkdir()
    (out / "r3_moe" / "r3_results.json").write_text("{}")
    reproduce.update_reference([], out, ref, studies=[out / "headroom", out / "r3_moe"])
    assert json.loads((ref / "headroom" / "headroom.json").read_text()) == {"runs": {"table": 1}}
    assert (ref / "r3_moe" / "r3_results.json").exists()  # a study that is not kept is replaced as before


def test_draw_all_only_the_runs_given(tmp_path):
    runs = system_runs(FIXTURE)
    written = figures.draw_all(FIXTURE, tmp_path, only=[runs["async_off_policy"], runs["verl"]])
    systems = pd.read_csv(tmp_path / "tables" / "systems.csv")
    assert list(systems.system) == ["relax async off-policy", "veRL (emulated)"]
    assert not (tmp_path / "tables" / "staleness.csv").exists()  # one staleness setting is no sweep
    assert tmp_path / "figures" / "critical_path_gantt.png" in written


def test_report_and_critical_path_draw_simulated_and_emulated_runs_labelled(tmp_path, capsys):
    """`relax simulate`'s run folder (no rewards: no engine ran) and an emulated-GPU run go through `relax report`
    and the critical path like any run, each labelled: an emulated run's step time is the emulated hardware's."""
    from relax.cli import main

    root = Path(__file__).resolve().parents[2]
    assert main(["simulate", str(root / "experiments/async/h800x16.yaml"), "--steps", "3", "--out",
                 str(tmp_path)]) == 0
    sim = find_runs([tmp_path])[0]
    emu = root / "results/reference/emulate/runs/async/h800x16-emu-h800/async_off_policy"
    df = report.report_table([sim, emu])
    assert list(df["kind"]) == ["SIMULATED (16x h800)", "EMULATED h800 (100x compression)"]
    assert df["reward start"].isna().iloc[0] and df["reward start"].notna().iloc[1]
    emu_summary = json.loads((emu / "summary.json").read_text())
    assert df["step time (s)"].iloc[1] == round(emu_summary["emulated_hardware"]["mean_step_time_s"], 4)
    assert df["step time (s)"].iloc[1] != round(emu_summary["mean_step_time_s"], 4)  # not this machine's seconds
    capsys.readouterr()
    assert main(["report", str(sim), str(emu)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED: the cost model" in out and "EMULATED: the real engine" in out
    table = critical_path.critical_path_table({"async_off_policy": sim})
    assert table["measured on"].iloc[0] == "SIMULATED (16x h800)"
    assert critical_path.plot_gantt({"async_off_policy": sim}, tmp_path).exists()
