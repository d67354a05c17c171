"""A Relax experiment as veRL's own launch (hydra overrides).

Checked against verl 0.9.1 (the current PyPI release): verl/trainer/main_ppo.py and
trainer/config/_generated_ppo_megatron_trainer.yaml for every key, the entry points and config files of
verl/experimental/one_step_off_policy and verl/experimental/fully_async_policy, and the repository's
docs/advance/{one_step_off,fully_async}.md for what the async keys mean.

Modes (the Relax `mode` each one runs):
  colocate      `verl.trainer.main_ppo model_engine=megatron`: hybrid engine, every role on every GPU.
  one_step_off  `verl.experimental.one_step_off_policy.main_ppo`: separate trainer and rollout pools, the
                rollout one step ahead, so staleness is exactly 1.
  fully_async   `verl.experimental.fully_async_policy.fully_async_main`: streaming rollouter and trainer,
                async_training.staleness_threshold = max_staleness (1 behaves like one-step-off, per the docs).

GPUs in the async modes: veRL runs the reference and old-log-prob forwards on its trainer pool, so the
trainer keeps resources.actor.gpus and the rest of the run's GPUs (Relax's rollout, reference and actor_fwd
pools) serve rollout. A veRL step is one optimizer update on prompts_per_step x group_size samples, as in
Relax: ppo_mini_batch_size is the whole batch and, fully async, weights sync after every such batch.
"""

from __future__ import annotations

from pathlib import Path

from baselines.common import (MAX_PROMPT_TOKENS, REWARD_FILE, ROLLOUT_MEM_FRACTION, TRAIN_TP, LaunchPlan, check,
                              default_out, gpus, nodes, reward_source, rollout_tp, total_gpus)
from relax.config import ExperimentConfig

MODES = {"colocate": "colocate", "one_step_off": "async", "fully_async": "async"}
ENTRY = {
    "colocate": ["verl.trainer.main_ppo", "model_engine=megatron"],
    "one_step_off": ["verl.experimental.one_step_off_policy.main_ppo",
                     "--config-name=one_step_off_ppo_megatron_trainer"],
    "fully_async": ["verl.experimental.fully_async_policy.fully_async_main",
                    "--config-name=fully_async_ppo_megatron_trainer"],
}


def translate(cfg: ExperimentConfig, mode: str, files_dir: str | Path | None = None) -> LaunchPlan:
    """veRL's launch of `cfg` in `mode`; `files_dir` is where the plan's config_files will be
    written (default: `default_out`)."""
    check(cfg, "verl", mode, MODES)
    files_dir = Path(files_dir or default_out("verl", cfg, mode))
    if mode == "one_step_off" and cfg.max_staleness != 1:
        raise ValueError(f"max_staleness: verl one_step_off always trains one step behind; got {cfg.max_staleness}")
    overrides = _common(cfg, files_dir) | _placement(cfg, mode)
    command = ["python3", "-m", *ENTRY[mode], *(f"{k}={_hydra(v)}" for k, v in overrides.items())]
    return LaunchPlan(command=command, env={"PYTHONUNBUFFERED": "1"}, config_files={REWARD_FILE: reward_source()})


def _common(cfg: ExperimentConfig, files_dir: Path) -> dict:
    a, r, t = cfg.algorithm, cfg.rollout, cfg.training
    o = {
        "data.train_files": cfg.task.params["path"],
        # No validation runs (test_freq -1, val_before_train False), but veRL still builds a val dataset.
        "data.val_files": cfg.task.params["path"],
        "data.prompt_key": "prompt",
        "data.max_prompt_length": MAX_PROMPT_TOKENS,
        "data.max_response_length": r.max_new_tokens,
        "data.truncation": "left",
        "data.train_batch_size": r.prompts_per_step,
        "data.seed": cfg.seed,
        "actor_rollout_ref.model.path": cfg.model.path,
        "actor_rollout_ref.actor.ppo_mini_batch_size": r.prompts_per_step,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": t.micro_batch_tokens,
        # training.parallel.tensor when the config trains with Megatron (the h800x16 files: 2), else Relax's TP 2
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size":
            t.parallel.tensor if t.trainer == "megatron" else TRAIN_TP,
        "actor_rollout_ref.actor.optim.lr": t.lr,
        "actor_rollout_ref.actor.optim.weight_decay": t.weight_decay,
        "actor_rollout_ref.actor.optim.betas": list(t.betas),
        "actor_rollout_ref.actor.optim.clip_grad": t.grad_clip,
        "actor_rollout_ref.actor.clip_ratio_low": a.clip_low,
        "actor_rollout_ref.actor.clip_ratio_high": a.clip_high,
        "actor_rollout_ref.actor.loss_agg_mode": a.loss_agg,
        # The KL term as a loss, so the reference forward runs whenever Relax runs its Reference role.
        "actor_rollout_ref.actor.use_kl_loss": a.kl_coef > 0,
        "actor_rollout_ref.actor.kl_loss_coef": a.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": a.kl_estimator,
        "actor_rollout_ref.rollout.name": r.engine,
        "actor_rollout_ref.rollout.n": r.group_size,
        "actor_rollout_ref.rollout.temperature": r.temperature,
        "actor_rollout_ref.rollout.top_p": r.top_p,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": rollout_tp(cfg),
        "actor_rollout_ref.rollout.gpu_memory_utilization": ROLLOUT_MEM_FRACTION,
        "algorithm.adv_estimator": a.advantage,
        "algorithm.norm_adv_by_std_in_grpo": a.norm_adv_by_std,
        "algorithm.use_kl_in_reward": False,
        "reward.custom_reward_function.path": str(files_dir / REWARD_FILE),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.logger": ["console"],
        "trainer.project_name": "relax-baselines",
        "trainer.experiment_name": f"{cfg.name}-{cfg.profile}",
        "trainer.total_training_steps": cfg.steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
    }
    if a.params.get("tis"):  # Relax --use-tis: truncated importance weights on the rollout/trainer gap
        o["algorithm.rollout_correction.rollout_is"] = "token"
        o["algorithm.rollout_correction.rollout_is_threshold"] = a.params.get("tis_cap", 2.0)
    return o


def _placement(cfg: ExperimentConfig, mode: str) -> dict:
    total = total_gpus(cfg)
    if mode == "colocate":
        n, per = nodes(total, "verl colocate pool")
        return {"trainer.nnodes": n, "trainer.n_gpus_per_node": per}
    trainer = gpus(cfg.resources.actor.gpus, "resources.actor.gpus")
    (tn, tper), (rn, rper) = nodes(trainer, "verl trainer pool"), nodes(total - trainer, "verl rollout pool")
    o = {"actor_rollout_ref.hybrid_engine": False, "trainer.nnodes": tn, "trainer.n_gpus_per_node": tper,
         "rollout.nnodes": rn, "rollout.n_gpus_per_node": rper}
    if mode == "fully_async":
        o |= {
            "data.train_batch_size": 0,  # unused when fully async (docs); the rollouter streams single prompts
            "rollout.total_rollout_steps": cfg.steps * cfg.rollout.prompts_per_step,
            "async_training.staleness_threshold": float(cfg.max_staleness),
            "async_training.trigger_parameter_sync_step": 1,
            "async_training.require_batches": 1,
            # Relax finishes every sample under one weight version; veRL's default resumes cut-off ones.
            "async_training.partial_rollout": False,
        }
    return o


def _hydra(value) -> str:
    """A value as hydra's override grammar reads it back."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_hydra(v) for v in value) + "]"
    return str(value)
