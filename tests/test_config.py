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


def test_colocate_requires_zero_staleness():
    with pytest.raises(ConfigError, match="max_staleness must be 0"):
        load_config(ROOT / "experiments/colocate/cpu.yaml", ["max_staleness=1"])


def test_capacity_must_hold_the_staleness_window():
    with pytest.raises(ConfigError, match="capacity_rows"):
        load_config(ROOT / "experiments/async/cpu.yaml", ["bus.capacity_rows=64", "max_staleness=4"])


def test_malformed_override():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])
