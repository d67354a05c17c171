"""The role registry: every role class by name, and the role set and order a config gets.

Each role declares when it runs (`enabled(cfg)`), the bus fields it reads and writes, and its per-partition
calls in the colocate loop (`phases`; relax/roles/base.py). From these:
- `role_order(cfg)`: the enabled roles, each after the roles that write the fields it reads;
- `colocate_steps(cfg)`: the (role, method) calls of one colocated partition in such an order.
Both are one topological order over reads/writes; roles that do not depend on each other keep the order of
`ROLES`. A schedule may start fewer roles (relax/schedules/, `role_names`).
"""

from __future__ import annotations

from relax.roles.actor import ActorRole
from relax.roles.actor_fwd import ActorFwdRole
from relax.roles.advantages import AdvantagesRole
from relax.roles.critic import CriticRole
from relax.roles.genrm import GenRMRole
from relax.roles.reference import ReferenceRole
from relax.roles.reward import RewardRole
from relax.roles.rollout import RolloutRole
from relax.roles.teacher import TeacherRole

# The Ray actor class of each role. The order breaks ties between independent roles (the services the
# Advantages role waits for run in this order in the colocate loop).
ROLES = {"rollout": RolloutRole, "reward": RewardRole, "genrm": GenRMRole, "reference": ReferenceRole,
         "actor_fwd": ActorFwdRole, "teacher": TeacherRole, "critic": CriticRole, "advantages": AdvantagesRole, "actor": ActorRole}


def role_class(name: str):
    """The plain Python class behind a role's Ray actor class (its declarations)."""
    cls = ROLES[name]
    return getattr(cls, "__ray_actor_class__", cls)


def task_of(name: str) -> str | None:
    """The bus task a role consumes rows under (the Actor's loader uses `actor_train`)."""
    if name == "actor":
        return "actor_train"
    return role_class(name).task or None


def _io(cls, cfg, phase: str) -> tuple[list[str], list[str]]:
    if phase == "train_partition":
        return cls.train_reads(cfg), []
    return cls.reads(cfg), cls.writes(cfg)


def colocate_steps(cfg) -> list[tuple[str, str]]:
    """(role, method) of every enabled role's phases, each after the phases that write what it reads and
    after its own earlier phase; of the steps ready at each point, the first in `ROLES` order goes next."""
    steps, io = [], {}
    for name in ROLES:
        cls = role_class(name)
        if cls.enabled(cfg):
            for phase in cls.phases:
                steps.append((name, phase))
                io[name, phase] = _io(cls, cfg, phase)
    writer: dict[str, tuple[str, str]] = {}
    for step in steps:
        for f in io[step][1]:
            if f in writer:
                raise ValueError(f"bus field '{f}' is written by both {writer[f][0]} and {step[0]}")
            writer[f] = step
    needs = {}
    for step in steps:
        missing = [f for f in io[step][0] if f not in writer]
        if missing:
            raise ValueError(f"{step[0]}.{step[1]} reads {missing}, which no role of this config writes")
        own = [s for s in steps if s[0] == step[0]]
        needs[step] = {writer[f] for f in io[step][0]} - {step} | set(own[:own.index(step)])
    order: list[tuple[str, str]] = []
    pending = list(steps)
    while pending:
        ready = next((s for s in pending if needs[s] <= set(order)), None)
        if ready is None:
            raise ValueError(f"the roles' fields form a cycle: {pending}")
        order.append(ready)
        pending.remove(ready)
    return order


def role_order(cfg) -> list[str]:
    """The enabled roles in dependency order (each role where its first phase falls in `colocate_steps`)."""
    return list(dict.fromkeys(name for name, _ in colocate_steps(cfg)))
