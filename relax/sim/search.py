"""`relax simulate CONFIG --search split`: the rollout:trainer GPU split of a cluster with the shortest simulated
step time. The cluster is the config's GPUs (every pool of an async run added up); reference and actor_fwd keep
their GPUs, and each candidate moves whole rollout replicas (the config's GPUs per replica) between the rollout
pool and the Actor, keeping the Actor a multiple of its model-parallel size."""

from __future__ import annotations

from relax.config import ConfigError, ExperimentConfig, role_parallel


def split_candidates(cfg: ExperimentConfig) -> list[tuple[int, int]]:
    """(rollout GPUs, actor GPUs) pairs with the config's cluster size, per-replica GPUs and trainer layout."""
    r = cfg.resources
    if cfg.mode == "colocate":
        raise ConfigError("mode: --search split needs separate pools (mode async); a colocated run shares them")
    per_replica = r.rollout.gpus / cfg.rollout.replicas
    if per_replica != int(per_replica) or per_replica < 1:
        raise ConfigError(f"resources.rollout.gpus: {r.rollout.gpus:g} GPUs over {cfg.rollout.replicas} replicas "
                          "is not a whole number of GPUs per replica")
    per_replica = int(per_replica)
    mp = role_parallel(cfg, "actor").model_parallel
    free = int(r.rollout.gpus + r.actor.gpus)  # what the split moves; reference and actor_fwd keep theirs
    out = []
    for rollout in range(per_replica, free, per_replica):
        actor = free - rollout
        if actor >= mp and actor % mp == 0:
            out.append((rollout, actor))
    if not out:
        raise ConfigError(f"resources: no rollout:actor split of {free} GPUs fits replicas of {per_replica} and an "
                          f"Actor layout of {mp} GPUs")
    return out


def with_split(cfg: ExperimentConfig, rollout: int, actor: int) -> ExperimentConfig:
    per_replica = int(cfg.resources.rollout.gpus / cfg.rollout.replicas)
    res = cfg.resources.model_copy(update={
        "rollout": cfg.resources.rollout.model_copy(update={"gpus": rollout}),
        "actor": cfg.resources.actor.model_copy(update={"gpus": actor})})
    ro = cfg.rollout.model_copy(update={"replicas": rollout // per_replica})
    return cfg.model_copy(update={"resources": res, "rollout": ro})


def search_split(cfg: ExperimentConfig, simulate, candidates: list[tuple[int, int]] | None = None) -> dict:
    """Simulate every candidate (default: split_candidates) with `simulate(cfg) -> mean step time (s)`; the
    argmin and every candidate's time (a candidate that does not fit, e.g. a replica too small for the KV cache,
    is listed with its error)."""
    rows = []
    for rollout, actor in candidates or split_candidates(cfg):
        try:
            t = simulate(with_split(cfg, rollout, actor))
            rows.append({"rollout_gpus": rollout, "actor_gpus": actor, "step_time_s": t})
        except ConfigError as err:
            rows.append({"rollout_gpus": rollout, "actor_gpus": actor, "step_time_s": None, "error": str(err)})
    ok = [r for r in rows if r["step_time_s"] is not None]
    if not ok:
        raise ConfigError("resources: no candidate split could be simulated:\n  " +
                          "\n  ".join(r["error"] for r in rows))
    return {"best": min(ok, key=lambda r: r["step_time_s"]), "candidates": rows}
