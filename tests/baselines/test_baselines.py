"""veRL / OpenRLHF baselines: the h800x16 configs, their translation into each framework's real launch (pinned
flag by flag), the log parsers on fixtures in each framework's console format, the shipped reward file and
the `relax baseline` command. Fast: no Ray, no framework installed."""

import argparse
import math
import subprocess
from pathlib import Path

import pytest

from baselines import cli, openrlhf, verl
from baselines.common import REWARD_FILE, reward_source
from relax.config import load_config

ROOT = Path(__file__).resolve().parents[2]
ASYNC = ROOT / "experiments/async/h800x16.yaml"
COLOCATE = ROOT / "experiments/colocate/h800x16.yaml"
FILES = "/shared/run"
MODEL, DATA = "/models/Qwen3-4B", "/data/dapo-math-17k.parquet"


def test_h800x16_configs_hold_the_paper_setting():
    for path, mode, staleness in [(ASYNC, "async", 1), (COLOCATE, "colocate", 0)]:
        cfg = load_config(path)
        assert (cfg.mode, cfg.profile, cfg.max_staleness) == (mode, "h800x16", staleness)
        assert (cfg.model.kind, cfg.model.path, cfg.model.tokenizer) == ("hf", MODEL, "hf")
        assert (cfg.task.name, cfg.task.params, cfg.task.reward) == ("dapo_math", {"path": DATA}, "math_verify")
        assert (cfg.rollout.engine, cfg.training.trainer) == ("sglang", "megatron")
        assert (cfg.rollout.max_new_tokens, cfg.rollout.prompts_per_step, cfg.rollout.group_size) == (20480, 32, 8)
        assert (cfg.algorithm.advantage, cfg.algorithm.clip_low, cfg.algorithm.clip_high) == ("grpo", 0.2, 0.28)
        assert (cfg.training.lr, cfg.training.weight_decay, cfg.training.betas) == (1e-6, 0.1, (0.9, 0.98))
    res = load_config(ASYNC).resources
    assert [res.actor.gpus, res.rollout.gpus, res.reference.gpus, res.actor_fwd.gpus] == [8, 4, 2, 2]
    res = load_config(COLOCATE).resources
    assert [res.actor.gpus, res.rollout.gpus, res.reference.gpus] == [16, 16, 16]


# --- veRL -----------------------------------------------------------------------------------------------
VERL_COMMON = {
    "data.train_files": DATA, "data.val_files": DATA, "data.prompt_key": "prompt",
    "data.max_prompt_length": "1024", "data.max_response_length": "20480", "data.truncation": "left",
    "data.train_batch_size": "32", "data.seed": "0",
    "actor_rollout_ref.model.path": MODEL,
    "actor_rollout_ref.actor.ppo_mini_batch_size": "32", "actor_rollout_ref.actor.use_dynamic_bsz": "true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "21504",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": "2",
    "actor_rollout_ref.actor.optim.lr": "1e-06", "actor_rollout_ref.actor.optim.weight_decay": "0.1",
    "actor_rollout_ref.actor.optim.betas": "[0.9,0.98]", "actor_rollout_ref.actor.optim.clip_grad": "1.0",
    "actor_rollout_ref.actor.clip_ratio_low": "0.2", "actor_rollout_ref.actor.clip_ratio_high": "0.28",
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.use_kl_loss": "true",
    "actor_rollout_ref.actor.kl_loss_coef": "0.001", "actor_rollout_ref.actor.kl_loss_type": "k3",
    "actor_rollout_ref.rollout.name": "sglang", "actor_rollout_ref.rollout.n": "8",
    "actor_rollout_ref.rollout.temperature": "1.0", "actor_rollout_ref.rollout.top_p": "1.0",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "0.8",
    "algorithm.adv_estimator": "grpo", "algorithm.norm_adv_by_std_in_grpo": "true",
    "algorithm.use_kl_in_reward": "false",
    "algorithm.rollout_correction.rollout_is": "token", "algorithm.rollout_correction.rollout_is_threshold": "2.0",
    "reward.custom_reward_function.path": f"{FILES}/{REWARD_FILE}",
    "reward.custom_reward_function.name": "compute_score",
    "trainer.logger": "[console]", "trainer.project_name": "relax-baselines",
    "trainer.total_training_steps": "200", "trainer.val_before_train": "false", "trainer.test_freq": "-1",
    "trainer.save_freq": "-1", "trainer.resume_mode": "disable",
}
VERL_SEPARATE = {"actor_rollout_ref.hybrid_engine": "false", "trainer.nnodes": "1", "trainer.n_gpus_per_node": "8",
                 "rollout.nnodes": "1", "rollout.n_gpus_per_node": "8", "trainer.experiment_name": "async-h800x16"}


def _overrides(command: list[str], head: int) -> dict[str, str]:
    pairs = [arg.split("=", 1) for arg in command[head:]]
    assert len({k for k, _ in pairs}) == len(pairs)
    return dict(pairs)


def test_verl_colocate_is_main_ppo_on_megatron_with_every_override_pinned():
    plan = verl.translate(load_config(COLOCATE), "colocate", FILES)
    assert plan.command[:4] == ["python3", "-m", "verl.trainer.main_ppo", "model_engine=megatron"]
    assert _overrides(plan.command, 4) == VERL_COMMON | {
        "trainer.nnodes": "2", "trainer.n_gpus_per_node": "8", "trainer.experiment_name": "colocate-h800x16"}
    assert plan.config_files == {REWARD_FILE: reward_source()}
    assert plan.env == {"PYTHONUNBUFFERED": "1"}


def test_verl_one_step_off_recipe_splits_trainer_and_rollout_pools():
    plan = verl.translate(load_config(ASYNC), "one_step_off", FILES)
    assert plan.command[:4] == ["python3", "-m", "verl.experimental.one_step_off_policy.main_ppo",
                                "--config-name=one_step_off_ppo_megatron_trainer"]
    assert _overrides(plan.command, 4) == VERL_COMMON | VERL_SEPARATE


def test_verl_fully_async_recipe_maps_staleness_and_one_sync_per_step():
    plan = verl.translate(load_config(ASYNC), "fully_async", FILES)
    assert plan.command[:4] == ["python3", "-m", "verl.experimental.fully_async_policy.fully_async_main",
                                "--config-name=fully_async_ppo_megatron_trainer"]
    assert _overrides(plan.command, 4) == VERL_COMMON | VERL_SEPARATE | {
        "data.train_batch_size": "0", "rollout.total_rollout_steps": "6400",
        "async_training.staleness_threshold": "1.0", "async_training.trigger_parameter_sync_step": "1",
        "async_training.require_batches": "1", "async_training.partial_rollout": "false"}


# --- OpenRLHF -------------------------------------------------------------------------------------------
OPENRLHF_COMMON = {
    "--actor.model_name_or_path": [MODEL], "--data.prompt_dataset": [DATA],
    "--data.input_key": ["prompt"], "--data.label_key": ["reward_model"], "--data.apply_chat_template": [],
    "--data.max_samples": ["6400"], "--data.max_len": ["21504"], "--rollout.max_new_tokens": ["20480"],
    "--rollout.batch_size": ["32"], "--rollout.n_samples_per_prompt": ["8"],
    "--rollout.temperature": ["1.0"], "--rollout.top_p": ["1.0"],
    "--train.batch_size": ["256"], "--train.micro_batch_size": ["1"], "--train.dynamic_batch_enable": [],
    "--train.max_tokens_per_gpu": ["21504"], "--ds.packing_samples": [], "--ds.zero_stage": ["3"],
    "--actor.gradient_checkpointing_enable": [], "--train.seed": ["0"],
    "--algo.advantage.estimator": ["group_norm"], "--actor.eps_clip_low_high": ["0.2", "0.28"],
    "--actor.loss_agg_mode": ["token-mean"], "--algo.kl.init_coef": ["0.001"], "--algo.kl.use_loss": [],
    "--algo.kl.estimator": ["k3"], "--actor.adam.lr": ["1e-06"], "--actor.adam.betas": ["0.9", "0.98"],
    "--actor.adam.weight_decay": ["0.1"], "--actor.max_norm": ["1.0"], "--actor.lr_scheduler": ["constant"],
    "--actor.lr_warmup_ratio": ["0"], "--reward.remote_url": [f"{FILES}/{REWARD_FILE}"],
    "--vllm.gpu_memory_utilization": ["0.8"], "--algo.advantage.is_correction_level": ["token"],
    "--algo.advantage.is_correction_mode": ["clip"], "--algo.advantage.is_correction_threshold": ["2.0"],
}


def _flags(command: list[str]) -> dict[str, list[str]]:
    assert command[:3] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    flags: dict[str, list[str]] = {}
    for arg in command[3:]:
        if arg.startswith("--"):
            assert arg not in flags
            current = flags[arg] = []
        else:
            current.append(arg)
    return flags


def test_openrlhf_colocate_shares_every_gpu_with_sleeping_engines():
    plan = openrlhf.translate(load_config(COLOCATE), "colocate", FILES)
    assert _flags(plan.command) == OPENRLHF_COMMON | {
        "--actor.num_nodes": ["2"], "--actor.num_gpus_per_node": ["8"], "--ref.num_nodes": ["2"],
        "--ref.num_gpus_per_node": ["8"], "--vllm.num_engines": ["16"], "--vllm.tensor_parallel_size": ["1"],
        "--train.colocate_all": [], "--vllm.enable_sleep": [], "--ds.enable_sleep": []}
    assert plan.config_files == {REWARD_FILE: reward_source()}


def test_openrlhf_async_keeps_actor_and_reference_pools_and_queues_max_staleness_batches():
    plan = openrlhf.translate(load_config(ASYNC), "async", FILES)
    assert _flags(plan.command) == OPENRLHF_COMMON | {
        "--actor.num_nodes": ["1"], "--actor.num_gpus_per_node": ["8"], "--ref.num_nodes": ["1"],
        "--ref.num_gpus_per_node": ["2"], "--vllm.num_engines": ["6"], "--vllm.tensor_parallel_size": ["1"],
        "--train.async_enable": [], "--train.async_queue_size": ["1"]}


# --- what cannot be translated ----------------------------------------------------------------------------
@pytest.mark.parametrize("framework, path, mode, message", [
    (verl, ASYNC, "hybrid", "unsupported mode 'hybrid'"),
    (openrlhf, ASYNC, "fully_async", "unsupported mode 'fully_async'"),
    (verl, ASYNC, "colocate", "config's mode is 'async'"),
    (openrlhf, COLOCATE, "async", "config's mode is 'colocate'"),
])
def test_unsupported_or_mismatched_mode_is_an_error(framework, path, mode, message):
    with pytest.raises(ValueError, match=message):
        framework.translate(load_config(path), mode, FILES)


def test_config_fields_a_framework_cannot_run_are_named():
    with pytest.raises(ValueError, match="max_staleness: verl one_step_off"):
        verl.translate(load_config(ASYNC, ["max_staleness=2"]), "one_step_off", FILES)
    with pytest.raises(ValueError, match="async_queue_size"):
        openrlhf.translate(load_config(ASYNC, ["max_staleness=0"]), "async", FILES)
    with pytest.raises(ValueError, match="task.reward"):
        verl.translate(load_config(COLOCATE, ["task.reward=exact"]), "colocate", FILES)
    with pytest.raises(ValueError, match="rollout.replicas"):
        openrlhf.translate(load_config(COLOCATE, ["rollout.replicas=3"]), "colocate", FILES)
    fully_async = verl.translate(load_config(ASYNC, ["max_staleness=2"]), "fully_async", FILES)
    assert "async_training.staleness_threshold=2.0" in fully_async.command


# --- log parsers --------------------------------------------------------------------------------------------
VERL_LOG = """\
(TaskRunnerV1 pid=2211) Training Progress:   0%|          | 0/200 [00:00<?, ?it/s]
(TaskRunnerV1 pid=2211) step:0 - val-core/math_dapo/acc/mean@1:0.31
(TaskRunnerV1 pid=2211) step:1 - actor/pg_loss:np.float64(0.012) - critic/score/mean:0.25 - \
response_length/mean:4096.0 - prompt_length/mean:256.0 - perf/total_num_tokens:1114112 - timing_s/gen:150.5 - \
timing_s/update_weights:4.5 - timing_s/step:225.9 - training/global_step:1
\x1b[36m(TaskRunnerV1 pid=2211)\x1b[0m step:2 - critic/score/mean:np.float64(0.375) - response_length/mean:2048.0 \
- prompt_length/mean:128.0 - perf/total_num_tokens:557056 - timing_s/gen:100.0 - timing_s/update_weights:4.0 - \
timing_s/step:nan
(TaskRunnerV1 pid=2211) global_step:3 - not a metrics line
"""
VERL_ASYNC_LOG = """\
(FullyAsyncTrainer pid=9) step:1 - timing_s/param_sync:3.25 - fully_async/rollouter/idle_ratio:0.1
(FullyAsyncTrainer pid=9) aggregated metrics done. cost 0.0012 seconds.
(FullyAsyncTrainer pid=9) step:1 - critic/score/mean:0.5 - response_length/mean:1000.0 - prompt_length/mean:24.0 \
- perf/total_num_tokens:262144 - timing_s/gen:0.11 - timing_s/step:125.6
"""


def test_verl_log_becomes_results_rows(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(VERL_LOG)
    df = verl.parse_log(log)
    assert list(df["step"]) == [1, 2]  # the validation-only step 0 is not a training step
    first = df.iloc[0]
    assert (first.step_time_s, first.wall_time_s, first.reward_mean) == (225.9, 225.9, 0.25)
    assert (first.samples, first.tokens) == (256, 256 * 4096)
    assert (first.trainer_wait_s, first.weight_sync_s, first["actor/pg_loss"]) == (150.5, 4.5, 0.012)
    assert df.iloc[1].reward_mean == 0.375 and df.iloc[1].samples == 256 and math.isnan(df.iloc[1].step_time_s)

    log.write_text(VERL_ASYNC_LOG)  # fully async: one step in two lines
    row = verl.parse_log(log).iloc[0]
    assert (row.step_time_s, row.weight_sync_s, row.trainer_wait_s, row.samples) == (125.6, 3.25, 0.11, 256)


OPENRLHF_LOG = """\
(PPOTrainer pid=77) INFO 11-30 05:08:11 ppo_trainer.py:224] Sample: ['What is 1+1? 2', 1.0]
(PPOTrainer pid=77) INFO 11-30 05:08:11 ppo_trainer.py:551] ✨ Global step 1: {'policy_loss': 0.01, \
'actor_lr': 1e-06, 'kl': tensor(0.0003), 'timing/make_experience': 20.0, 'timing/ppo_train': 50.0, \
'timing/broadcast': 5.0, 'rollout/reward_mean': 0.25, 'rollout/reward_std': 0.43, \
'rollout/response_length_mean': 4096.0, 'rollout/truncated_rate': 0.0, 'rollout/num_samples': 256.0, \
'timing/generation': 150.9, 'timing/step_total': 225.9}
(TrainingActor pid=78) INFO 11-30 05:12:01 ppo_trainer_async.py:244] Global step 2: {'policy_loss': -0.02, \
'timing/make_experience': 10.0, 'timing/ppo_train': 40.0, 'timing/broadcast': 2.5, \
'rollout/reward_mean': np.float64(0.5), 'rollout/response_length_mean': 1000.0, 'rollout/num_samples': 256.0, \
'timing/generation': 120.0, 'timing/step_total': 60.5}
(TrainingActor pid=78) INFO 11-30 05:12:09 ppo_trainer_async.py:214] Eval at step 2: {'eval_default_pass1': 0.3}
"""


def test_openrlhf_log_becomes_results_rows(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(OPENRLHF_LOG)
    df = openrlhf.parse_log(log)
    assert list(df["step"]) == [1, 2]
    first, second = df.iloc[0], df.iloc[1]
    assert (first.step_time_s, first.reward_mean, first.samples, first.tokens) == (225.9, 0.25, 256, 256 * 4096)
    assert first.trainer_wait_s == pytest.approx(150.9) and first.weight_sync_s == 5.0 and first.kl == 0.0003
    assert second.reward_mean == 0.5 and second.wall_time_s == pytest.approx(286.4)
    assert second.trainer_wait_s == pytest.approx(8.0)  # async: the wait for the queue


def test_a_log_without_training_steps_is_an_error(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("nothing here\n")
    for framework in (verl, openrlhf):
        with pytest.raises(ValueError, match="no training-step metrics"):
            framework.parse_log(log)


# --- the shipped reward file --------------------------------------------------------------------------------
def test_reward_file_grades_with_math_verify_in_both_signatures():
    from baselines import reward_math_verify as reward

    assert reward.compute_score("math_dapo", "so the answer is \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert reward.compute_score("math_dapo", "Answer: 7", "8") == 0.0
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    out = reward.reward_func([prompt + "It is $4$.", prompt + "It is 5."], [prompt, prompt],
                             [{"ground_truth": "4", "style": "rule"}, "4"])
    assert out["rewards"].tolist() == [1.0, 0.0] and out["scores"] is out["rewards"]


# --- `relax baseline` -------------------------------------------------------------------------------------
def _run(argv):
    parser = argparse.ArgumentParser(prog="relax")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_dry_run_prints_the_command_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "verl-run"
    assert _run(["baseline", "verl", str(ASYNC), "--dry-run", "--out", str(out)]) == 0
    plan = verl.translate(load_config(ASYNC), "fully_async", out.resolve())  # async -> fully_async by default
    assert capsys.readouterr().out.strip() == plan.shell()
    assert sorted(p.name for p in out.iterdir()) == ["launch.sh", REWARD_FILE]
    assert (out / REWARD_FILE).read_text() == reward_source()
    script = (out / "launch.sh").read_text()
    assert "verl 0.9.1 launch (mode fully_async)" in script and "| tee train.log" in script
    # Run it with a stand-in python3 that echoes its environment and argv: the script passes the exact plan.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text('#!/bin/sh\necho "PYTHONUNBUFFERED=$PYTHONUNBUFFERED"\nprintf "%s\\n" "$@"\n')
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    subprocess.run(["bash", str(out / "launch.sh")], check=True, env=env, capture_output=True)
    assert (out / "train.log").read_text().splitlines() == ["PYTHONUNBUFFERED=1", *plan.command[1:]]


def test_files_default_to_the_results_folder_by_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = openrlhf.translate(load_config(ASYNC), "async")
    where = tmp_path.resolve() / "results/baselines/openrlhf/async/async" / REWARD_FILE
    assert _flags(plan.command)["--reward.remote_url"] == [str(where)]


def test_dry_run_takes_overrides_and_a_mode(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["baseline", "openrlhf", str(COLOCATE), "model.path=/nfs/qwen", "--mode", "colocate", "--dry-run",
            "--out", str(out)]
    assert _run(argv) == 0
    assert "--actor.model_name_or_path /nfs/qwen" in capsys.readouterr().out


def test_without_dry_run_it_refuses_and_writes_nothing(tmp_path, capsys):
    assert _run(["baseline", "openrlhf", str(ASYNC), "--out", str(tmp_path / "o")]) == 2
    assert "never in Relax's" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_unsupported_mode_is_a_clear_cli_error(tmp_path, capsys):
    assert _run(["baseline", "verl", str(ASYNC), "--mode", "async", "--dry-run", "--out", str(tmp_path)]) == 2
    assert "unsupported mode 'async'" in capsys.readouterr().err
