"""`relax run CONFIG --dry-run`: resolve an experiment into the cluster plan it would run, without a GPU.

The plan names every role, its backend (megatron / sglang / torch / CPU), its Ray resources and placement group
(bundles), the Megatron parallel layout of each Megatron role (TP / PP / CP / EP / expert TP, data parallel size,
checked against the model's shapes), and the SGLang launch command of every rollout replica.

The layout of each Megatron role is `training.parallel` (the Actor) or `training.forward_parallel` (Reference,
ActorFwd; None: the Actor's), checked against the role's GPUs and the model's shapes (the HF config when the folder
is here, else the built-in Qwen3 table); `resolve_plan(cfg, parallel={...})` overrides it (keys tp, pp, cp, ep, etp,
sp). The h800x16 files carry redai-infra/Relax's settings (run-qwen3-4B-16xgpu.sh, run-qwen3-30B-A3B-16xgpu-async.sh).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

GPUS_PER_NODE = 8  # H800 / H100 nodes

# Public Qwen3 shapes, used when the model folder is not on this machine (a dry run on a laptop).
QWEN3 = {
    "qwen3-0.6b": dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-4b": dict(num_hidden_layers=36, hidden_size=2560, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                          num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False),
    # The thinker's text model (its vision and audio towers are not in this table).
    "qwen3-omni-30b-a3b-instruct": dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128, intermediate_size=768,
                                        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                        vocab_size=152064, tie_word_embeddings=False),
}

MEGATRON_ROLES = ("actor", "reference", "actor_fwd", "critic")


def model_facts(cfg) -> tuple[dict | None, str]:
    """The model's HF config (dict) and where it came from."""
    m = cfg.model
    if m.kind in ("tiny_qwen3", "tiny_qwen3_moe"):
        from relax.models import tiny_config
        from relax.models.tokenizer import CharTokenizer

        return tiny_config(m, CharTokenizer.vocab_size).to_dict(), "built from model.* fields"
    if m.kind == "tiny_omni":
        from relax.models import tiny_config
        from relax.omni.tokenizer import OmniTokenizer

        return tiny_config(m, OmniTokenizer.vocab_size).to_dict(), "built from model.* fields (+ media encoders)"
    if m.kind == "hf" and m.path:
        conf = Path(m.path) / "config.json"
        if conf.is_file():
            return json.loads(conf.read_text()), str(conf)
        key = Path(m.path).name.lower()
        if key in QWEN3:
            return dict(QWEN3[key]), f"built-in Qwen3 table ({Path(m.path).name}; folder not on this machine)"
    return None, "unknown (model folder not on this machine)"


def _roles(cfg) -> list[str]:
    from relax.placement import planned_roles

    return planned_roles(cfg)


def _res(cfg, role):
    return getattr(cfg.resources, role, None) or getattr(cfg.resources, "actor")


def megatron_layout(cfg, gpus: int, hf: dict | None, override: dict | None = None, role: str = "actor") -> dict:
    """TP / PP / CP / EP / expert TP / DP / SP for one Megatron role on `gpus` ranks (its GPUs, or its CPU ranks;
    from the config), with the problems found against the role's ranks and the model's shapes."""
    from relax.config import role_parallel

    moe = bool(hf and (hf.get("num_experts") or hf.get("num_local_experts")))
    p = role_parallel(cfg, role)
    lay = {"tp": p.tensor, "pp": p.pipeline, "cp": p.context, "ep": p.expert, "etp": p.etp,
           "sp": p.sequence_parallel}
    lay.update(override or {})
    from relax.config import ParallelConfig

    pc = ParallelConfig(tensor=lay["tp"], pipeline=lay["pp"], context=lay["cp"], expert=lay["ep"],
                        expert_tensor=lay["etp"], sequence_parallel=lay["sp"])
    shapes = {}
    if hf:
        shapes = dict(heads=hf.get("num_attention_heads"), kv_heads=hf.get("num_key_value_heads"),
                      layers=hf.get("num_hidden_layers"),
                      experts=int(hf.get("num_experts") or hf.get("num_local_experts") or 0))
    problems = pc.problems(gpus, **shapes)
    if hf:
        from relax.trainers.megatron.convert import Parallel, QwenLayout

        try:
            Parallel(tp=lay["tp"], pp=lay["pp"], ep=lay["ep"], etp=lay["etp"]).check(
                QwenLayout.from_hf_config(hf, tp=lay["tp"]))
        except ValueError as e:
            problems.append(str(e))
    dp = max(gpus, 1) // pc.model_parallel if max(gpus, 1) % pc.model_parallel == 0 else None
    # Megatron's expert-data-parallel size: world / (EP x expert TP x PP)
    edp = max(gpus, 1) // (lay["ep"] * lay["etp"] * lay["pp"]) if moe else None
    return {"tp": lay["tp"], "pp": lay["pp"], "cp": lay["cp"], "ep": lay["ep"], "etp": lay["etp"], "dp": dp,
            "expert_dp": edp, "sequence_parallel": bool(lay["sp"]), "moe": moe,
            "expert_layout": "te_grouped" if moe else None, "source": "override" if override else (
                "training.forward_parallel" if role != "actor" and cfg.training.forward_parallel is not None
                else "training.parallel"), "problems": sorted(set(problems), key=problems.index)}


def resolve_plan(cfg, *, parallel: dict | None = None, gpus_per_node: int = GPUS_PER_NODE, base_port: int = 30000) -> dict:
    from relax import placement
    from relax.config import megatron_roles, role_world_size, runs_megatron
    from relax.engines.sglang import engine_tp_size, sglang_command

    hf, source = model_facts(cfg)
    roles = _roles(cfg)
    colocate = cfg.mode == "colocate"
    gpu_roles = placement.gpu_roles(cfg)
    gpus = {r: _res(cfg, r).gpus for r in roles}
    total = placement.colocate_world(cfg) if colocate else int(sum(gpus.values()))
    problems: list[str] = []
    plan: dict = {
        "experiment": cfg.name, "profile": cfg.profile, "mode": cfg.mode, "max_staleness": cfg.max_staleness,
        "cluster": {"gpus": total, "gpus_per_node": gpus_per_node, "nodes": max(1, math.ceil(total / gpus_per_node)),
                    "join": "head: `ray start --head --port=6379`; others: `ray start --address=HEAD_IP:6379`; "
                            "then run `relax run` on any node (RAY_ADDRESS=auto)"},
        "model": {"kind": cfg.model.kind, "path": cfg.model.path, "config_source": source,
                  "layers": hf and hf.get("num_hidden_layers"),
                  "moe": bool(hf and (hf.get("num_experts") or hf.get("num_local_experts")))},
        "roles": [], "placement_groups": [], "megatron": {}, "rollout": {}, "problems": problems, "notes": [],
    }
    if colocate and gpu_roles:  # the group the supervisor makes (relax/placement.py), shared by every GPU role
        plan["placement_groups"].append({"name": "colocate", "strategy": "PACK",
                                         "bundles": placement.bundles(cfg, gpu_roles[0]), "shared_by": gpu_roles})
        problems += placement.colocate_problems(cfg)
    for role in roles:
        res = _res(cfg, role)
        if role == "rollout":
            backend = cfg.rollout.engine
        elif role in MEGATRON_ROLES:
            # the Actor / Reference as they will run; other Megatron roles with GPUs as planned (not started yet)
            backend = "megatron" if runs_megatron(cfg, role) or (role in megatron_roles(cfg) and res.gpus > 0) \
                else "torch"
        elif role == "reward":
            backend = f"rule ({cfg.task.reward}), CPU"
        else:
            backend = "CPU"
        entry = {"role": role, "backend": backend, "cpus": res.cpus, "gpus": res.gpus, "placement_group": None,
                 "workers": role_world_size(cfg, role) if backend == "megatron" else 1}
        if res.gpus > 0:
            entry["placement_group"] = placement.group_name(cfg, role)
            if colocate:
                entry["gpu_fraction_per_bundle"] = placement.gpu_share(cfg, role)
            if role == "rollout" and cfg.rollout.engine == "sglang":
                try:
                    engine_tp_size(cfg)
                except ValueError as e:
                    problems.append(str(e))
                entry["workers"] = cfg.rollout.replicas
            else:
                entry["workers"] = int(res.gpus)
            if not colocate:
                try:
                    bundles = placement.bundles(cfg, role)
                except ValueError:  # the engine's TP does not divide: reported above
                    bundles = [{"GPU": 1, "CPU": res.cpus}] * cfg.rollout.replicas
                plan["placement_groups"].append({"name": f"{role}_pg", "strategy": "PACK", "bundles": bundles,
                                                 "shared_by": [role]})
        plan["roles"].append(entry)
        if backend == "megatron":
            lay = megatron_layout(cfg, role_world_size(cfg, role), hf, parallel, role=role)
            lay["forward_only"] = role != "actor"
            n = role_world_size(cfg, role)
            pg = entry["placement_group"] or "-"
            lay["launch"] = (f"{n} rank(s), one per GPU bundle of {pg}, env RANK=0..{n - 1} WORLD_SIZE={n} "
                             f"MASTER_ADDR=<bundle 0 node>: rank 0 is the {role} role's process (bundle 0), ranks "
                             f"1..{n - 1} Ray workers (MegatronRank) on the other bundles; torch.distributed NCCL + "
                             "Megatron parallel state")
            if res.gpus == 0:
                plan["notes"].append(f"{role}: {n} CPU rank(s), megatron-core's CUDA calls emulated on the CPU "
                                     "(relax/trainers/megatron/cpu_shim.py): a test of the code path, not a way to train")
            if not runs_megatron(cfg, role):
                plan["notes"].append(f"{role}: runs its own model in one process (no Megatron group for it yet)")
            lay["micro_batch_tokens"] = cfg.training.micro_batch_tokens
            problems += [f"{role}: {p}" for p in lay["problems"]]
            plan["megatron"][role] = lay
    if colocate and gpu_roles:
        megatron = [r for r in gpu_roles if runs_megatron(cfg, r)]
        plan["notes"].append(
            "colocate on GPUs: `relax run` makes the one `colocate` group above (relax/placement.py); every GPU "
            f"process asks its role's share of its bundle's GPU ({', '.join(megatron) or 'no'} Megatron ranks; the "
            "rollout's share is for its SGLang engines, launch_sglang_engines(placement=...)), so Ray admits the roles "
            "side by side on the same GPUs and the colocated schedule time-slices them")
    if cfg.rollout.engine == "sglang":
        cmds, rp = [], plan["rollout"]
        try:
            tp = engine_tp_size(cfg)
            for r in range(cfg.rollout.replicas):
                port = base_port + 2 * r
                cmds.append({"replica": r, "gpus": tp, "bundle": r, "port": port,
                             "command": sglang_command(cfg, r, port=port, nccl_port=base_port + 1000 + r)})
        except ValueError as e:
            if str(e) not in problems:
                problems.append(str(e))
            tp = None
        rp.update({"backend": "sglang", "replicas": cfg.rollout.replicas, "gpus_per_engine": tp, "commands": cmds,
                   "return_routed_experts": plan["model"]["moe"]})
        world = 1 + cfg.rollout.replicas * (tp or 1)
        rp["weight_sync"] = ("CUDA IPC / disk after the actor trains (engines sleep with --enable-memory-saver)"
                             if colocate else f"DCS NCCL broadcast, actor rank 0 + engine ranks (world {world}), "
                                              "bucketed, pause -> flush -> update -> continue")
    else:
        plan["rollout"] = {"backend": "torch", "replicas": cfg.rollout.replicas, "commands": []}
    return plan


def format_plan(plan: dict) -> str:
    from tabulate import tabulate

    c, m = plan["cluster"], plan["model"]
    out = [f"experiment {plan['experiment']} / {plan['profile']}: mode {plan['mode']}, max_staleness "
           f"{plan['max_staleness']}",
           f"cluster: {c['gpus']} GPUs on {c['nodes']} node(s) x {c['gpus_per_node']}; {c['join']}",
           f"model: {m['kind']} {m['path'] or ''} ({m['layers']} layers, {'MoE' if m['moe'] else 'dense'}; "
           f"config: {m['config_source']})", ""]
    rows = [[r["role"], r["backend"], r["cpus"], r["gpus"], r["workers"], r["placement_group"] or "-",
             r.get("gpu_fraction_per_bundle", "")] for r in plan["roles"]]
    out.append(tabulate(rows, headers=["role", "backend", "cpus", "gpus", "workers", "placement group",
                                       "GPU share"]))
    if plan["placement_groups"]:
        out.append("")
        rows = []
        for pg in plan["placement_groups"]:
            b = pg["bundles"]
            rows.append([pg["name"], pg["strategy"], f"{len(b)} x {json.dumps(b[0]) if b else '{}'}",
                         ", ".join(pg["shared_by"])])
        out.append(tabulate(rows, headers=["placement group", "strategy", "bundles", "roles"]))
    if plan["megatron"]:
        out.append("")
        rows = [[role, lay["tp"], lay["pp"], lay["cp"], lay["ep"], lay["etp"], lay["dp"],
                 "yes" if lay["sequence_parallel"] else "no", "forward" if lay["forward_only"] else "train"]
                for role, lay in plan["megatron"].items()]
        out.append(tabulate(rows, headers=["megatron role", "TP", "PP", "CP", "EP", "expert TP", "DP", "SP", "work"]))
    rp = plan["rollout"]
    if rp.get("commands"):
        out += ["", f"SGLang engines: {rp['replicas']} x {rp['gpus_per_engine']} GPU(s); weight sync: "
                    f"{rp['weight_sync']}"]
        out += [f"  [{c['replica']}] {c['command']}" for c in rp["commands"]]
    out += [f"note: {n}" for n in plan.get("notes", [])]
    out += ["", "problems: " + ("none" if not plan["problems"] else "; ".join(plan["problems"]))]
    return "\n".join(out) + "\n"
