from pathlib import Path

import pytest

from relax.config import ConfigError, load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[1]
# omni and agent experiments included: one schema; a study's variants.yaml holds overrides of those, not a config
ENGINE_CONFIGS = sorted(p for p in ROOT.glob("experiments/*/*.yaml") if p.name != "variants.yaml")


@pytest.mark.parametrize("path", ENGINE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.steps >= 1
    assert cfg.name == path.parent.name


def test_overrides_are_typed_yaml_values():
    cfg = load_config(ROOT / "experiments/async/cpu.yaml",
                      ["rollout.temperature=0.7", "max_staleness=2", "task.params={min_digits: 1}", "steps=3"])
    assert cfg.rollout.temperature == 0.7 and cfg.max_staleness == 2 and cfg.steps == 3
    assert cfg.task.params == {"min_digits": 1}


@pytest.mark.parametrize("override, field", [
    ("rollout.group_siz=4", "rollout.group_siz"),
    ("rollout.group_size=1", "rollout.group_size"),
    ("mode=sideways", "mode"),
    ("training.lr=-1", "training.lr"),
    ("resources.actor.threads=0", "resources.actor.threads"),
])
def test_bad_key_or_value_names_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "experiments/async/cpu.yaml", [override])
    assert field in str(err.value)


@pytest.mark.parametrize("overrides, field", [
    (["rollout.engine=torch_http"], "rollout.engine"),
    (["schedule=verl"], "schedule"),
])
def test_remax_refuses_what_cannot_give_it_a_greedy_baseline(overrides, field):
    with pytest.raises(ConfigError, match="remax") as err:
        load_config(ROOT / "experiments/async/cpu.yaml", ["algorithm.advantage=remax", *overrides])
    assert field in str(err.value)
    load_config(ROOT / "experiments/async/cpu.yaml", ["algorithm.advantage=remax"])  # the torch engine: accepted


def test_colocate_requires_zero_staleness():
    with pytest.raises(ConfigError, match="max_staleness must be 0"):
        load_config(ROOT / "experiments/colocate/cpu.yaml", ["max_staleness=1"])


def test_capacity_must_hold_the_staleness_window():
    with pytest.raises(ConfigError, match="capacity_rows"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["bus.capacity_rows=64", "max_staleness=4"])


def test_malformed_override():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])


# ---- issue 16: errors before anything starts (relax/preflight.py; no Ray here) -------------------------------

import json  # noqa: E402
import sys  # noqa: E402

from relax.cli import main as relax_main  # noqa: E402
from relax.preflight import preflight  # noqa: E402

CPU = ROOT / "experiments/async/cpu.yaml"


def _validate_cli(capsys, *argv) -> str:
    """`relax validate ...`: exit 2 and its stderr line (no traceback)."""
    rc = relax_main(["validate", *map(str, argv)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    return err


def test_a_missing_non_utf8_or_malformed_yaml_file_names_the_file_and_line(tmp_path, capsys):
    assert "no such config file" in _validate_cli(capsys, tmp_path / "nope.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: async\nsteps: 2\ntask: {name: caf\xe9}\n")
    err = _validate_cli(capsys, bad)
    assert str(bad) in err and "line 3" in err and "UTF-8" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: async\nrollout:\n  group_size: [4\n  replicas: 1\n")
    err = _validate_cli(capsys, broken)
    assert str(broken) in err and "line " in err and "invalid YAML" in err
    assert f"{tmp_path}: cannot read it" in _validate_cli(capsys, tmp_path)


@pytest.mark.parametrize("override", ["rollout.temperature=[0.7", "task.params={a: 1", "a..b=1", "=3", "steps"])
def test_a_malformed_override_names_the_override(capsys, override):
    err = _validate_cli(capsys, CPU, override) if "=" in override else None
    if err is None:  # no `=`: argparse takes it for a stray argument
        with pytest.raises(SystemExit):
            relax_main(["validate", str(CPU), "--steps", "1", override])
        return
    assert "override" in err and override in err


@pytest.mark.parametrize("override, field", [
    ("training.lr=.inf", "training.lr"), ("rollout.temperature=.inf", "rollout.temperature"),
    ("training.lr=.nan", "training.lr"), ("rollout.top_p=.nan", "rollout.top_p"),
    ("algorithm.kl_coef=-.inf", "algorithm.kl_coef"), ("algorithm.params={clip_ratio_high: .inf}", "algorithm.params"),
])
def test_non_finite_numbers_are_refused(capsys, override, field):
    assert field in _validate_cli(capsys, CPU, override)


@pytest.mark.parametrize("override, field", [
    ("algorithm.advantage=grpoo", "algorithm.advantage"), ("algorithm.policy_loss=ppo_clipp", "algorithm.policy_loss"),
    ("algorithm.params={no_such_param: 1}", "algorithm.params"),
    ("task.name=basic_arithmetik", "task.name"), ("task.params={no_such_param: 1}", "task.params"),
    ("schedule=verl", "max_staleness"),  # verl is exactly one step off-policy
    ("model.max_position=16", "model.max_position"),
])
def test_registry_task_schedule_and_prompt_length_fail_in_validate(capsys, override, field):
    overrides = [override, "max_staleness=2"] if override == "schedule=verl" else [override]
    assert field in _validate_cli(capsys, CPU, *overrides)


def test_schedule_verl_with_mode_colocate_fails_validate_as_it_fails_run(capsys):
    # the colocate experiment is valid for the schema (max_staleness 0): only the verl schedule refuses it
    err = _validate_cli(capsys, ROOT / "experiments/colocate/cpu.yaml", "schedule=verl")
    assert "mode: the verl schedule" in err


def test_an_unusable_api_port_fails_validate(capsys):
    import socket

    assert "--api-port" in _validate_cli(capsys, CPU, "--api-port", "70000")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert f"127.0.0.1:{port}" in _validate_cli(capsys, CPU, "--api-port", port)
    assert relax_main(["validate", str(CPU), "--api-port", "0"]) == 0


def _data(tmp_path, content: bytes) -> list[str]:
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    return ["task.name=local_dataset", "task.reward=math_verify", f"task.params={{path: {data}, prompt: problem}}",
            "task.eval_size=1", "task.size=2"]


def test_a_data_file_with_unreadable_rows_names_the_row(tmp_path, capsys):
    good = json.dumps({"problem": "1+1?", "answer": "2"}).encode() + b"\n"
    two = good + json.dumps({"problem": "2+2?", "answer": "4"}).encode() + b"\n"
    assert relax_main(["validate", str(CPU), *_data(tmp_path, two + json.dumps({"problem": "3", "answer": "3"}).encode())]) == 0
    capsys.readouterr()
    err = _validate_cli(capsys, CPU, *_data(tmp_path, two + b'{"problem": "caf\xe9", "answer": "1"}\n'))
    assert "data.jsonl line 3" in err and "UTF-8" in err
    err = _validate_cli(capsys, CPU, *_data(tmp_path, good + b"{not json\n"))
    assert "data.jsonl line 2" in err
    err = _validate_cli(capsys, CPU, *_data(tmp_path, two + json.dumps({"problem": "x"}).encode() + b"\n"))
    assert "task.params.answer: data.jsonl row 2 column 'answer'" in err
    err = _validate_cli(capsys, CPU, *_data(tmp_path, two + json.dumps({"problem": "", "answer": "1"}).encode() + b"\n"))
    assert "task.params.prompt: data.jsonl row 2 column 'problem'" in err
    assert "no such file" in _validate_cli(capsys, CPU, *_data(tmp_path, good)[:2], "task.params={path: /no/such.jsonl, prompt: q}")


def test_run_fails_before_the_run_folder_exists_and_before_ray(tmp_path, capsys, monkeypatch):
    import relax.controller

    monkeypatch.setattr(relax.controller, "Controller", lambda *a, **k: pytest.fail("the run started"))
    for override in ["algorithm.advantage=grpoo", "task.name=nope", "algorithm.params={typo: 1}", "training.lr=.inf"]:
        rc = relax_main(["run", str(CPU), override, "--out", str(tmp_path / "out")])
        assert rc == 2 and "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


def test_validate_and_run_share_one_preflight():
    import inspect

    import relax.cli
    import relax.controller

    assert "preflight(" in inspect.getsource(relax.cli.cmd_validate)
    assert "preflight(" in inspect.getsource(relax.controller.run_experiment)
    preflight(load_config(CPU))  # a shipped config passes
