"""The role registry (relax/roles/registry.py): the role set and the colocate order follow from what each role
declares it reads and writes, and equal the orders the controller used before they were derived (fast, no
Ray)."""

from pathlib import Path

import pytest

from relax.config import load_config
from relax.roles.registry import colocate_steps, role_class, role_order, task_of
from relax.schedules import role_names

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ROOT / "experiments/async"
KL_OFF, KL_ON = "algorithm.kl_coef=0", "algorithm.kl_coef=0.05"
OPD, GAE, GENRM = "algorithm.policy_loss=opd", "algorithm.advantage=gae", "task.reward=genrm"


def _cfg(name="cpu.yaml", *overrides, folder=ASYNC):
    return load_config(folder / name, list(overrides))


@pytest.mark.parametrize("name, overrides, expected", [
    ("cpu.yaml", [KL_OFF], ["rollout", "reward", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON], ["rollout", "reward", "reference", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON, OPD], ["rollout", "reward", "reference", "teacher", "advantages", "actor"]),
    ("cpu.yaml", [KL_OFF, OPD], ["rollout", "reward", "teacher", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON, GAE], ["rollout", "reward", "reference", "critic", "advantages", "actor"]),
    ("cpu.yaml", [KL_OFF, GAE], ["rollout", "reward", "critic", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON, GENRM], ["rollout", "genrm", "reference", "advantages", "actor"]),
    ("cpu.yaml", [KL_OFF, GENRM], ["rollout", "genrm", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON, OPD, GAE, GENRM],
     ["rollout", "genrm", "reference", "teacher", "critic", "advantages", "actor"]),
    ("cpu.yaml", [KL_OFF, OPD, GAE], ["rollout", "reward", "teacher", "critic", "advantages", "actor"]),
    ("cpu.yaml", [KL_ON, "algorithm.dynamic_sampling.enabled=true"],
     ["rollout", "reward", "reference", "advantages", "actor"]),
    # veRL's trainer computes the reference log-probs itself: no Reference service
    ("cpu-verl.yaml", [KL_ON], ["rollout", "reward", "advantages", "actor"]),
    ("cpu-verl.yaml", [KL_ON, OPD, GAE, GENRM], ["rollout", "genrm", "teacher", "critic", "advantages", "actor"]),
    ("cpu-openrlhf.yaml", [KL_ON], ["rollout", "reward", "reference", "advantages", "actor"]),
])
def test_role_names_equal_the_controllers_former_order(name, overrides, expected):
    assert role_names(_cfg(name, *overrides)) == expected


@pytest.mark.parametrize("overrides, services", [
    ([KL_OFF], ["reward"]),
    ([KL_ON], ["reward", "reference"]),
    ([KL_ON, OPD, GENRM], ["genrm", "reference", "teacher"]),
    ([KL_ON, GAE], ["reward", "reference", "critic"]),
    ([KL_ON, OPD, GAE, GENRM], ["genrm", "reference", "teacher", "critic"]),
])
def test_colocate_steps_equal_the_former_loop(overrides, services):
    """Before: generate, every service's process_partition in role order, Advantages, then the critic's value
    step (it needs the returns Advantages writes), then the Actor's step."""
    cfg = _cfg("cpu.yaml", *overrides, folder=ROOT / "experiments/colocate")
    critic = "critic" in services
    expected = [("rollout", "generate_partition"), *((n, "process_partition") for n in services),
                ("advantages", "process_partition"), *[("critic", "train_partition")] * critic,
                ("actor", "train_partition")]
    assert colocate_steps(cfg) == expected
    assert role_order(cfg) == ["rollout", *services, "advantages", "actor"]


def test_every_read_has_an_earlier_writer():
    """The derived order is topological: each step comes after the step writing every field it reads."""
    cfg = _cfg("cpu.yaml", KL_ON, OPD, GAE, "algorithm.dynamic_sampling.enabled=true")
    written: set[str] = set()
    for name, phase in colocate_steps(cfg):
        cls = role_class(name)
        reads = cls.train_reads(cfg) if phase == "train_partition" else cls.reads(cfg)
        assert set(reads) <= written, (name, phase, set(reads) - written)
        written |= set(cls.writes(cfg)) if phase != "train_partition" else set()


def test_remax_baseline_goes_from_the_rollout_to_advantages_only_when_selected():
    remax, grpo = _cfg("cpu.yaml", "algorithm.advantage=remax"), _cfg("cpu.yaml")
    assert "baseline_rewards" in role_class("rollout").writes(remax)
    assert "baseline_rewards" in role_class("advantages").reads(remax)
    assert "baseline_rewards" not in role_class("rollout").writes(grpo) + role_class("advantages").reads(grpo)


def test_declarations_follow_the_config():
    cfg = _cfg("cpu.yaml", KL_ON, GAE, "algorithm.dynamic_sampling.enabled=true")
    assert "ref_log_probs" in role_class("actor").reads(cfg)
    assert "ref_log_probs" not in role_class("actor").reads(_cfg("cpu.yaml", KL_OFF))
    assert {"keep", "ds_attempts"} <= set(role_class("actor").reads(cfg))
    assert role_class("advantages").writes(cfg) == ["advantages", "returns", "keep"]
    assert "values" in role_class("advantages").reads(cfg)
    assert [task_of(n) for n in ("actor", "reward", "genrm", "reference", "rollout")] == \
        ["actor_train", "reward", "reward", "ref_log_probs", None]


def test_inconsistent_declarations_are_refused(monkeypatch):
    cfg = _cfg("cpu.yaml", KL_ON)
    reward = role_class("reward")
    monkeypatch.setattr(reward, "reads", classmethod(lambda cls, cfg: ["prompt_index", "nobody_writes_this"]))
    with pytest.raises(ValueError, match="nobody_writes_this"):
        colocate_steps(cfg)
    monkeypatch.setattr(reward, "reads", classmethod(lambda cls, cfg: ["advantages"]))  # Advantages reads rewards
    with pytest.raises(ValueError, match="cycle"):
        colocate_steps(cfg)
    monkeypatch.undo()
    monkeypatch.setattr(role_class("genrm"), "enabled", classmethod(lambda cls, cfg: True))
    with pytest.raises(ValueError, match="rewards"):  # Reward and GenRM both writing `rewards`
        colocate_steps(cfg)
