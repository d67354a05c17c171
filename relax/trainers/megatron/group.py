"""A Megatron worker group: one trainer role (the Actor) running on N ranks, one process each.

The role's own process is global rank 0; `MegatronGroup` starts ranks 1..N-1 as Ray actors (`MegatronRank`), and
all N join one torch.distributed group (NCCL on GPUs, gloo on a CPU-only machine with megatron-core's CUDA calls
emulated by cpu_shim: the same code) and Megatron's parallel state with the role's TP / PP / CP / EP. On GPUs each
rank holds one GPU: rank r is placed in bundle r of the placement group the role itself was placed in (the
supervisor makes it with relax.placement: one {GPU: 1} bundle per rank; in colocate mode the one group every GPU
role shares, each rank asking its role's fraction of the bundle's GPU). Ray ties the ranks' lives to the role's
process: when the role dies (Tier 2 restart) its ranks go with it.

Every call of the trainer interface is dispatched to all ranks at once (the remote ranks first, then rank 0 in
this process), since Megatron's collectives need every rank:
- `accumulate(mb, scale)`: the micro-batch's rows are split over the data-parallel ranks (balanced by tokens);
  the ranks of one data-parallel replica (its TP / PP / CP peers) get the same rows. A data-parallel rank left
  without a row gets one with loss weight 0 (its forward still runs, so expert-parallel all-to-alls match).
  Metrics come from the last pipeline stage (tensor rank 0, every context rank) of every data-parallel replica:
  `loss` (a sum under the Actor's unit loss scale) is added up, `*_max` / `*_min` taken over them, the other
  metrics averaged weighted by each rank's response tokens.
- `divide_grads`, `step`: on every rank; `step` returns rank 0's result (the gradient norm is global).
- `sync_hf(model)`: every rank's shards are gathered to rank 0 (this process), converted to Hugging Face names
  and copied into `model`, which the role publishes through DCS once, as with one rank.
- `log_probs`: rows split like `accumulate`, results returned by each replica's last stage and put back in order.
- `optimizer_state()` / `load_optimizer_state()`: every rank's optimizer state, with the layout it belongs to.
"""

from __future__ import annotations

import logging
import os

import ray
import torch

from relax.engines.process import free_port
from relax.trainers.megatron.trainer import build_rank_trainer

log = logging.getLogger(__name__)

TRAIN_KEYS = ("prompt_ids", "response_ids", "old_log_probs", "advantages", "rollout_log_probs", "ref_log_probs")
# A collective waiting this long on a rank means that rank is gone (its process died or hangs).
COLLECTIVE_TIMEOUT_S = 600.0


def _rank_env(rank: int, world: int, addr: str, port: int) -> None:
    # One GPU is visible to each rank (Ray sets CUDA_VISIBLE_DEVICES from its bundle): local device 0.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR=addr, MASTER_PORT=str(port))


def coords() -> dict:
    """This rank's place in Megatron's parallel state."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    return {"rank": dist.get_rank(), "dp": ps.get_data_parallel_rank(), "tp": ps.get_tensor_model_parallel_rank(),
            "pp": ps.get_pipeline_model_parallel_rank(), "cp": ps.get_context_parallel_rank(),
            "ep": ps.get_expert_model_parallel_rank(), "last": ps.is_pipeline_last_stage(),
            "dp_size": ps.get_data_parallel_world_size(), "pid": os.getpid()}


class MegatronRank:
    """Global rank `rank` (>= 1) of a Megatron worker group; rank 0 is the role's own process. Started as a Ray
    actor (`ray.remote(MegatronRank)`)."""

    def __init__(self, cfg, hf_config, hf_state, pad_id: int, rank: int, world: int, addr: str, port: int,
                 threads: int, role: str = "actor"):
        torch.set_num_threads(threads)
        _rank_env(rank, world, addr, port)
        self.trainer = build_rank_trainer(cfg, hf_config, hf_state, pad_id, role, COLLECTIVE_TIMEOUT_S)

    def coords(self) -> dict:
        return coords()

    def call(self, method: str, *args):
        return getattr(self.trainer, method)(*args)

    def gather_hf(self) -> None:
        self.trainer.hf_state()  # this rank's shards go to rank 0; nothing comes back here


def gpu_placement_group(cfg, role: str = "actor", timeout_s: float = 600.0):
    """The placement group a Megatron role's ranks go in (relax.placement): one {GPU: 1, CPU: cpus} bundle per rank
    in async mode (the plan's `<role>_pg`), the group shared by every GPU role in colocate mode; PACKed. The
    supervisor makes it once (relax.placement.Placement) and reuses it for every restart of the role."""
    from relax.placement import make_group

    return make_group(cfg, role, timeout_s)


def rank_options(pg, rank: int, num_gpus: float = 1.0) -> dict:
    """Ray options placing rank `rank` of a group on its GPU bundle (`num_gpus` < 1: a colocated share)."""
    from relax.placement import bundle_options

    return bundle_options(pg, rank, num_gpus)


def split_rows(lengths: list[int], parts: int) -> list[list[int]]:
    """Row indices for each data-parallel rank: longest rows first, each to the rank with the fewest tokens so
    far; every part keeps the rows' original order."""
    load, out = [0] * parts, [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        d = min(range(parts), key=lambda d: (load[d], d))
        out[d].append(i)
        load[d] += lengths[i]
    return [sorted(p) for p in out]


def _select(mb: dict, rows: list[int]) -> dict:
    return {k: (v[rows] if isinstance(v, torch.Tensor) else [v[i] for i in rows]) for k, v in mb.items()}


class MegatronGroup:
    """The trainer interface (`accumulate`, `divide_grads`, `step`, `sync_hf`, `log_probs`, optimizer state) over
    N ranks; rank 0's trainer lives in this process."""

    def __init__(self, cfg, model, pad_id: int, world: int, role: str = "actor"):
        from relax.placement import process_options
        from relax.trainers.megatron.convert import hf_state_from_model

        self.world, self.role = world, role
        res = getattr(cfg.resources, role)
        state = hf_state_from_model(model)
        self.workers = []
        addr, port = "127.0.0.1", free_port("")  # a group of one (the GPU check runs it) needs no Ray
        if world > 1:
            addr, state_ref = ray.util.get_node_ip_address(), ray.put(state)
            pg = ray.util.get_current_placement_group() if res.gpus > 0 else None
            remote_rank = ray.remote(MegatronRank)
        for r in range(1, world):
            opts: dict = {"num_cpus": res.cpus, "name": f"relax-{role}-rank{r}-{os.getpid()}"}
            if res.gpus > 0:
                if pg is None:
                    raise RuntimeError(f"{role}: a {world}-GPU Megatron group needs its process placed in a "
                                       "placement group (relax.trainers.megatron.group.gpu_placement_group)")
                opts.update(process_options(cfg, role, pg, r))  # a whole GPU, or its colocated share
            self.workers.append(remote_rank.options(**opts).remote(
                cfg, model.config, state_ref, pad_id, r, world, addr, port, res.threads, role))
        _rank_env(0, world, addr, port)
        try:
            self.local = build_rank_trainer(cfg, model.config, state, pad_id, role, COLLECTIVE_TIMEOUT_S)  # joins the ranks
        except Exception:
            self._raise_worker_error()
            raise
        del state
        self.coords = [coords(), *self._get([w.coords.remote() for w in self.workers])]
        self.dp = self.coords[0]["dp_size"]
        # Who reports metrics / log-probs: each data-parallel replica's last pipeline stage at tensor rank 0 (every
        # context rank for metrics, each over its chunk of the sequences; context rank 0 for the gathered log-probs).
        self.reporters = {c["dp"]: c["rank"] for c in self.coords if c["last"] and c["tp"] == 0 and c["cp"] == 0}
        self.metric_ranks = [(c["dp"], c["rank"]) for c in self.coords if c["last"] and c["tp"] == 0]
        log.info("Megatron group of %d ranks up (DP %d): %s", world, self.dp, self.coords)

    # --- dispatch ---------------------------------------------------------------------------------------------
    def _raise_worker_error(self) -> None:
        ready, _ = ray.wait([w.coords.remote() for w in self.workers], num_returns=len(self.workers), timeout=5)
        for ref in ready:
            ray.get(ref)  # raises the rank's own start-up error

    def _get(self, refs: list):
        if not refs:
            return []
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as err:
            # A rank's process is gone: the group cannot go on (its collectives would wait forever). End this
            # process too, so the supervisor sees the role die and restarts it with a new group (the Actor: Tier 2,
            # the Reference: Tier 1).
            log.error("a Megatron rank of %s died (%s): ending the role's process", self.role, err)
            os._exit(1)

    def _all(self, method: str, per_rank_args, local_fn=None):
        """Call `method` on every rank (remote ranks first); returns the results in rank order."""
        refs = [w.call.remote(method, *per_rank_args(r)) for r, w in zip(range(1, self.world), self.workers)]
        try:
            mine = (local_fn or getattr(self.local, method))(*per_rank_args(0))
        except Exception:
            self._get(refs)  # a dead rank explains a failed collective
            raise
        return [mine, *self._get(refs)]

    def _split(self, mb: dict, keys=TRAIN_KEYS) -> list[tuple[list[int], dict]]:
        """Rows and fields of each data-parallel replica's part (an empty part gets row 0 with loss weight 0)."""
        mb = {k: mb[k] for k in keys if k in mb}
        lengths = [len(p) + len(r) for p, r in zip(mb["prompt_ids"], mb["response_ids"])]
        parts = []
        for rows in split_rows(lengths, self.dp):
            parts.append((rows, _select(mb, rows)) if rows else ([], {**_select(mb, [0]), "loss_weight": 0.0}))
        return parts

    def _dispatch_parts(self, method: str, parts: list, args_of):
        """`method(*args_of(part))` on every rank with its replica's part (put in the object store once)."""
        local = [args_of(p) for _, p in parts]
        refs = [[ray.put(a) for a in args] for args in local] if self.workers else []
        return self._all(method, lambda r: (local if r == 0 else refs)[self.coords[r]["dp"]])

    # --- the trainer interface ----------------------------------------------------------------------------------
    def accumulate(self, mb: dict, scale) -> dict[str, float]:
        parts = self._split(mb)
        results = self._dispatch_parts("accumulate", parts, lambda p: (p, scale))
        merged: dict[str, float] = {}
        weights: dict[str, float] = {}
        for d, rank in self.metric_ranks:
            m = dict(results[rank] or {})
            if not parts[d][0] or not m:
                continue
            n = m.pop("mask_tokens", 0.0)
            for k, v in m.items():
                if k == "loss":
                    merged[k] = merged.get(k, 0.0) + v
                elif k.endswith("_max"):
                    merged[k] = max(merged.get(k, v), v)
                elif k.endswith("_min"):
                    merged[k] = min(merged.get(k, v), v)
                else:
                    merged[k] = merged.get(k, 0.0) + v * n
                    weights[k] = weights.get(k, 0.0) + n
        return {k: v / weights[k] if k in weights else v for k, v in merged.items() if weights.get(k, 1.0) > 0}

    def divide_grads(self, denom: float) -> None:
        self._all("divide_grads", lambda r: (denom,))

    def step(self, skip: bool = False) -> dict[str, float]:
        return {**self._all("step", lambda r: (skip,))[0], "trainer_ranks": self.world}

    @torch.no_grad()
    def sync_hf(self, model) -> int:
        from relax.trainers.megatron.convert import copy_hf_into_model

        return copy_hf_into_model(model, self.hf_state())

    @torch.no_grad()
    def log_probs(self, prompts, responses, token_budget: int, routing=None, inputs=None) -> list[torch.Tensor]:
        if routing or inputs:
            raise NotImplementedError("the Megatron trainer takes no routing replay or media inputs")
        parts = self._split({"prompt_ids": list(prompts), "response_ids": list(responses)})
        results = self._dispatch_parts("log_probs", parts,
                                       lambda p: (p["prompt_ids"], p["response_ids"], token_budget))
        out: list = [None] * len(prompts)
        for d, rank in self.reporters.items():
            rows, _ = parts[d]
            for i, lp in zip(rows, results[rank] or []):
                out[i] = lp
        return out

    def describe(self) -> str:
        return self.local.describe()

    def optimizer_state(self) -> dict:
        return {"world": self.world, "coords": [{k: c[k] for k in ("dp", "tp", "pp", "cp", "ep")} for c in self.coords],
                "ranks": self._all("optimizer_state", lambda r: ())}

    def load_optimizer_state(self, state: dict) -> None:
        layout = [{k: c[k] for k in ("dp", "tp", "pp", "cp", "ep")} for c in self.coords]
        if state.get("world") != self.world or state.get("coords") != layout:
            raise ValueError(f"optimizer checkpoint of world {state.get('world')} does not fit this group "
                             f"(world {self.world}, layout {layout})")
        self._all("load_optimizer_state", lambda r: (state["ranks"][r],))

    def hf_state(self, device: str = "cpu"):
        """The HF-named weights gathered from every rank (this process is rank 0)."""
        refs = [w.gather_hf.remote() for w in self.workers]
        state = self.local.hf_state(device)
        self._get(refs)
        return state


__all__ = ["COLLECTIVE_TIMEOUT_S", "MegatronGroup", "MegatronRank", "gpu_placement_group", "rank_options", "split_rows"]
