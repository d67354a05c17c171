"""A Relax experiment as OpenRLHF's own launch (`python3 -m openrlhf.cli.train_ppo_ray`).

Checked against OpenRLHF 0.11.2 (the current PyPI release): every flag is one its argument parser
(openrlhf/cli/train_ppo_ray.py) defines; since 0.11 they are dotted (`--rollout.n_samples_per_prompt`,
`--train.colocate_all`, `--algo.advantage.estimator`, ...), replacing the flat names of earlier releases.

Modes (the Relax `mode` each one runs):
  colocate  --train.colocate_all with vLLM and DeepSpeed sleep: actor, reference and vLLM engines share
            every GPU, as asserted by the launcher (actor GPUs == engines x TP).
  async     --train.async_enable: a generator actor keeps --train.async_queue_size (= max_staleness)
            rollout batches ahead of the trainer.

Differences that stay: OpenRLHF trains with DeepSpeed (ZeRO-3 here, as its examples do for 4B models) and
generates with vLLM; it has no Megatron or SGLang backend. It keeps its actor and reference pools at Relax's
sizes; it has no ActorFwd pool (old log-probs are computed on the actor), so Relax's actor_fwd GPUs serve
rollout. Grading uses the shipped reward file through --reward.remote_url.
"""

from __future__ import annotations

from pathlib import Path

from baselines.common import (MAX_PROMPT_TOKENS, REWARD_FILE, ROLLOUT_MEM_FRACTION, LaunchPlan, check, default_out,
                              gpus, nodes, reward_source, rollout_tp, total_gpus)
from relax.config import ExperimentConfig

MODES = {"colocate": "colocate", "async": "async"}
LOSS_AGG = ("token-mean", "seq-mean-token-mean")


def translate(cfg: ExperimentConfig, mode: str, files_dir: str | Path | None = None) -> LaunchPlan:
    """OpenRLHF's launch of `cfg` in `mode`; `files_dir` is where the plan's config_files will be
    written (default: `default_out`)."""
    check(cfg, "openrlhf", mode, MODES)
    files_dir = Path(files_dir or default_out("openrlhf", cfg, mode))
    a, r, t = cfg.algorithm, cfg.rollout, cfg.training
    if a.loss_agg not in LOSS_AGG:
        raise ValueError(f"algorithm.loss_agg: OpenRLHF aggregates {LOSS_AGG}, not {a.loss_agg!r}")
    args = [
        "--actor.model_name_or_path", cfg.model.path,
        "--data.prompt_dataset", cfg.task.params["path"],
        # DAPO-Math rows: chat messages under `prompt`, the answer in `reward_model` (the reward file unpacks it).
        "--data.input_key", "prompt", "--data.label_key", "reward_model", "--data.apply_chat_template",
        "--data.max_samples", cfg.steps * r.prompts_per_step,  # one pass over them = `steps` rollout batches
        "--data.max_len", MAX_PROMPT_TOKENS + r.max_new_tokens,
        "--rollout.max_new_tokens", r.max_new_tokens,
        "--rollout.batch_size", r.prompts_per_step,
        "--rollout.n_samples_per_prompt", r.group_size,
        "--rollout.temperature", r.temperature,
        "--rollout.top_p", r.top_p,
        "--train.batch_size", cfg.rows_per_step,  # one optimizer update per step, as in Relax
        "--train.micro_batch_size", 1,
        "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", t.micro_batch_tokens, "--ds.packing_samples",
        "--ds.zero_stage", 3, "--actor.gradient_checkpointing_enable",
        "--train.seed", cfg.seed,
        "--algo.advantage.estimator", "group_norm",  # GRPO: (r - group mean) / group std
        *([] if a.norm_adv_by_std else ["--algo.advantage.no_std_norm"]),
        "--actor.eps_clip_low_high", a.clip_low, a.clip_high,
        "--actor.loss_agg_mode", a.loss_agg,
        # init_coef 0 leaves the reference model out, as Relax does when kl_coef is 0.
        "--algo.kl.init_coef", a.kl_coef,
        *(["--algo.kl.use_loss", "--algo.kl.estimator", a.kl_estimator] if a.kl_coef > 0 else []),
        "--actor.adam.lr", t.lr, "--actor.adam.betas", *t.betas, "--actor.adam.weight_decay", t.weight_decay,
        "--actor.max_norm", t.grad_clip, "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", 0,
        "--reward.remote_url", str(files_dir / REWARD_FILE),
        "--vllm.gpu_memory_utilization", ROLLOUT_MEM_FRACTION,
        *_placement(cfg, mode),
    ]
    if a.params.get("tis"):  # Relax --use-tis: token-level importance weights clipped to [0, tis_cap]
        args += ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip",
                 "--algo.advantage.is_correction_threshold", a.params.get("tis_cap", 2.0)]
    command = ["python3", "-m", "openrlhf.cli.train_ppo_ray", *map(str, args)]
    return LaunchPlan(command=command, env={"PYTHONUNBUFFERED": "1"}, config_files={REWARD_FILE: reward_source()})


def _placement(cfg: ExperimentConfig, mode: str) -> list:
    total, tp = total_gpus(cfg), rollout_tp(cfg)
    with_ref = cfg.algorithm.kl_coef > 0
    if mode == "colocate":
        return [*_pool("actor", total), *(_pool("ref", total) if with_ref else []),
                "--vllm.num_engines", total // tp, "--vllm.tensor_parallel_size", tp,
                "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    if cfg.max_staleness < 1:
        raise ValueError("max_staleness: OpenRLHF async buffers at least one batch (--train.async_queue_size >= 1)")
    actor = gpus(cfg.resources.actor.gpus, "resources.actor.gpus")
    ref = gpus(cfg.resources.reference.gpus, "resources.reference.gpus") if with_ref else 0
    rollout = total - actor - ref
    if rollout < tp or rollout % tp:
        raise ValueError(f"resources: the {rollout} GPUs left for vLLM do not make engines of {tp} GPUs")
    return [*_pool("actor", actor), *(_pool("ref", ref) if with_ref else []),
            "--vllm.num_engines", rollout // tp, "--vllm.tensor_parallel_size", tp,
            "--train.async_enable", "--train.async_queue_size", cfg.max_staleness]


def _pool(role: str, n_gpus: int) -> list:
    n, per = nodes(n_gpus, f"openrlhf {role} pool")
    return [f"--{role}.num_nodes", n, f"--{role}.num_gpus_per_node", per]
