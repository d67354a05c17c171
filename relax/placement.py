"""Where the GPU processes of a run go on the Ray cluster: the placement groups and each process's Ray options.

One module for the dry-run plan (relax/plan.py), the supervisor (which makes the groups), the Megatron worker group
(its ranks) and the SGLang launcher (its engines), so that what the plan prints and what runs cannot disagree.

- mode async: every GPU role has a group of its own (`<role>_pg`, PACK): a Megatron role one {GPU: 1, CPU: cpus}
  bundle per rank, the rollout one {GPU: tp, CPU: cpus} bundle per SGLang engine; each process asks its bundle's
  whole GPU(s).
- mode colocate: the GPU roles share ONE group (`colocate`, PACK) of `world` {GPU: 1, CPU: sum of the sharing roles'
  cpus} bundles, world = the most GPUs any of them has (they time-share the same GPUs, so not their sum). A process
  of role R on bundle b (Megatron rank b of the Actor / Reference, SGLang engine b of the rollout) asks 1/n of the
  bundle's GPU (n = the GPU roles sharing it, rounded down to Ray's 1e-4 resolution) and R's cpus, so Ray admits
  the n roles' processes side by side on the same GPU; the colocated schedule time-slices them (the engines sleep,
  releasing their memory, while the Actor trains). The fraction is Ray's admission bookkeeping only: Ray does not
  cap a process's GPU memory or compute.

The rollout role's own process (the driver of its engines) holds no GPU and is placed with CPUs only.
"""

from __future__ import annotations

import math

# Ray accounts fractional resources in units of 1e-4.
RAY_RESOLUTION = 10_000


def planned_roles(cfg) -> list[str]:
    """The roles of a run as the plan lists them."""
    from relax.config import model_roles

    model = model_roles(cfg)
    return ["rollout", "reward", *(["reference"] if "reference" in model else []), "advantages",
            *(r for r in model if r != "reference")]


def _res(cfg, role):
    return getattr(cfg.resources, role, None) or cfg.resources.actor


def gpu_roles(cfg) -> list[str]:
    return [r for r in planned_roles(cfg) if _res(cfg, r).gpus > 0]


def colocated(cfg) -> bool:
    """One shared GPU placement group (mode colocate with GPU roles)."""
    return cfg.mode == "colocate" and bool(gpu_roles(cfg))


def colocate_world(cfg) -> int:
    """Bundles (GPUs) of the shared group: the most GPUs any colocated role has."""
    return int(math.ceil(max((_res(cfg, r).gpus for r in gpu_roles(cfg)), default=0)))


def gpu_share(cfg, role: str) -> float:
    """The GPU a process of `role` asks of its bundle: 1 (a whole GPU per bundle, async) or 1/n of the shared
    bundle's GPU (colocate, n roles sharing it)."""
    if not colocated(cfg):
        return 1.0
    roles = gpu_roles(cfg)
    if role not in roles:
        raise ValueError(f"{role}: no GPUs in resources.{role}, so no share of the colocate group")
    return math.floor(RAY_RESOLUTION / len(roles)) / RAY_RESOLUTION


def group_name(cfg, role: str) -> str:
    return "colocate" if colocated(cfg) else f"{role}_pg"


def _engine_tp(cfg) -> int:
    from relax.engines.sglang import engine_tp_size

    return engine_tp_size(cfg)


def bundles(cfg, role: str) -> list[dict]:
    """The bundles of the group `role`'s GPU processes are placed in (the shared one in colocate mode)."""
    from relax.config import role_world_size

    if colocated(cfg):
        cpus = sum(_res(cfg, r).cpus for r in gpu_roles(cfg))
        return [{"GPU": 1, **({"CPU": cpus} if cpus else {})}] * colocate_world(cfg)
    res = _res(cfg, role)
    if res.gpus <= 0:
        raise ValueError(f"{role}: no GPUs in resources.{role}, so no placement group")
    cpu = {"CPU": res.cpus} if res.cpus else {}
    if role == "rollout":
        if cfg.rollout.engine == "sglang":
            return [{"GPU": _engine_tp(cfg), **cpu}] * cfg.rollout.replicas
        return [{"GPU": 1, **cpu}] * int(math.ceil(res.gpus))
    return [{"GPU": 1, **cpu}] * role_world_size(cfg, role)


def colocate_problems(cfg) -> list[str]:
    """What keeps the GPU roles from sharing 1-GPU bundles (empty in async mode)."""
    if not colocated(cfg) or cfg.rollout.engine != "sglang" or _res(cfg, "rollout").gpus <= 0:
        return []
    try:
        tp = _engine_tp(cfg)
    except ValueError:
        return []  # reported by the engine's own check
    if tp > 1:
        return [f"colocate: an SGLang engine of TP {tp} needs {tp} GPUs in one process, but the shared group's "
                "bundles hold one GPU each (use one engine per GPU: rollout.replicas = resources.rollout.gpus)"]
    return []


def make_group(cfg, role: str, timeout_s: float = 600.0):
    """Make and wait for the placement group of `role` (see `bundles`)."""
    import ray

    b = bundles(cfg, role)
    pg = ray.util.placement_group(b, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"placement group {group_name(cfg, role)}: {len(b)} bundle(s) of {b[0]} not available in "
                           f"the Ray cluster after {timeout_s:.0f} s (cluster resources: "
                           f"{ray.cluster_resources()})") from None
    return pg


def bundle_options(pg, bundle: int, num_gpus: float, num_cpus: float | None = None) -> dict:
    """Ray options placing one process on bundle `bundle` of `pg`, asking `num_gpus` of it."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    opts = {"num_gpus": num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle)}
    if num_cpus is not None:
        opts["num_cpus"] = num_cpus
    return opts


def process_options(cfg, role: str, pg, bundle: int) -> dict:
    """Ray options of a GPU process of `role` on `bundle` of `pg`: a Megatron rank (bundle = its rank) or, for the
    rollout, SGLang engine `bundle` (its TP's GPUs in async mode)."""
    if role == "rollout" and cfg.rollout.engine == "sglang":
        problems = colocate_problems(cfg)
        if problems:
            raise ValueError(problems[0])
        gpus = gpu_share(cfg, role) if colocated(cfg) else _engine_tp(cfg)
    else:
        gpus = gpu_share(cfg, role)
    return bundle_options(pg, bundle, gpus, _res(cfg, role).cpus)


class Placement:
    """The run's GPU placement groups, made on first use and kept (restarted roles reuse their bundles): one per
    GPU role in async mode, one shared by all of them in colocate mode. Picklable (it can be handed to a role)."""

    def __init__(self, cfg, timeout_s: float = 600.0):
        self.cfg, self.timeout_s = cfg, timeout_s
        self.groups: dict = {}

    def group(self, role: str):
        name = group_name(self.cfg, role)
        if name not in self.groups:
            self.groups[name] = make_group(self.cfg, role, self.timeout_s)
        return self.groups[name]

    def options(self, role: str, bundle: int) -> dict:
        return process_options(self.cfg, role, self.group(role), bundle)

    def release(self) -> None:
        import ray

        for pg in self.groups.values():
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - Ray already gone
                pass
        self.groups.clear()


__all__ = ["Placement", "bundle_options", "bundles", "colocate_problems", "colocate_world", "colocated",
           "gpu_roles", "gpu_share", "group_name", "make_group", "planned_roles", "process_options"]
