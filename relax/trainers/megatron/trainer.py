"""The Megatron-Core trainer: a GPTModel built from a Qwen3 / Qwen3-MoE Hugging Face config with TP / PP / CP / EP,
behind the same interface as `relax.trainers.TorchTrainer` (`log_probs`, `accumulate(mb, scale)`, `step()`).

Needs megatron-core. Megatron's code calls CUDA even for tiny models; on a CPU-only machine `init_distributed`
installs `cpu_shim` (CUDA device arguments mapped to the CPU, gloo process groups), which runs the same megatron-core
code on the CPU for tests: an emulation of the device, not a way to train.
Every process of the trainer group runs this code (torchrun or Ray workers with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT set); a single process with no such variables is a world of one.

Data layout: sequences are packed prompt + response, right-padded (causal attention makes trailing pads inert),
and every per-token field (old / rollout / reference log-probs, advantages, mask) is placed at the position of the
logit that predicts that token, so context parallelism can split all of them along the sequence with Megatron's
load-balanced (2 x CP chunks) split. Log-probs use Megatron's vocab-parallel cross entropy on
`logits / temperature`, with the vocabulary padding rows masked out so they match the Hugging Face model.

Gradients: each micro-batch's loss is the policy loss under the step's global `LossScale` (computed by the caller
over all data-parallel ranks) times the data-parallel size; Megatron's pipeline schedule multiplies by CP and its
DDP averages over DP x CP, so the accumulated gradient is exactly the gradient of the step's loss. `step()`
all-reduces once (finalize_model_grads), clips and applies the optimizer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil
import torch

from relax.algorithms import LossScale, aggregate, check_config, get_policy_loss, kl_penalty
from relax.trainers.megatron.convert import Parallel, QwenLayout, hf_to_megatron, megatron_to_hf, merge, shard
from relax.trainers.budget import budget_slices


def megatron_importable() -> bool:
    try:
        import megatron.core  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def megatron_available() -> bool:
    """megatron-core importable and a CUDA device present (the real backend)."""
    return megatron_importable() and torch.cuda.is_available()


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def init_distributed(par: Parallel, cp: int = 1, seed: int = 0, timeout_s: float | None = None) -> None:
    """torch.distributed + Megatron's parallel state, once per process. NCCL on CUDA; on a CPU-only machine gloo
    with `cpu_shim` (megatron-core's CUDA calls emulated on the CPU: a test aid, see cpu_shim.py)."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not cuda:
        from relax.trainers.megatron import cpu_shim

        cpu_shim.enable()
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1))))
        from datetime import timedelta

        from relax.weights.transport import store

        addr = os.environ["MASTER_ADDR"]
        # gloo would listen on the address the host name resolves to: pin it to MASTER_ADDR's interface (a
        # local group stays on loopback). The user's own GLOO_SOCKET_IFNAME wins.
        nic = next((name for name, addrs in psutil.net_if_addrs().items() if any(a.address == addr for a in addrs)),
                   None)
        if nic is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", nic)
        # Rank 0 hosts the rendezvous store on MASTER_ADDR only (torch's own would listen on every interface).
        rendezvous = store(addr, int(os.environ["MASTER_PORT"]), master=rank == 0, timeout_s=timeout_s or 1800.0,
                           world_size=world, wait_for_workers=False)
        dist.init_process_group("nccl" if cuda else "gloo", store=rendezvous, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s) if timeout_s else None)
    if ps.model_parallel_is_initialized() and (
            ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size()) != (par.tp, par.pp, cp, par.ep, par.expert_tp):
        ps.destroy_model_parallel()  # another layout in this process (tests): rebuild the groups
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=par.tp, pipeline_model_parallel_size=par.pp,
                                     context_parallel_size=cp, expert_model_parallel_size=par.ep,
                                     expert_tensor_parallel_size=par.expert_tp)
    model_parallel_cuda_manual_seed(seed)


def _patch_missing_te_gemm() -> None:
    """megatron-core 0.16 bug: moe_utils only defines `te_general_gemm` when Transformer Engine imports, yet the
    router's gating (RouterGatingLinearFunction) reads it unconditionally, so every MoE forward without TE raises
    NameError. Define it as None (megatron's own torch.mm fallback)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def transformer_config(L: QwenLayout, par: Parallel, cp: int, *, rms_eps: float = 1e-6, bf16: bool = False,
                       sequence_parallel: bool | None = None):
    from megatron.core.transformer import TransformerConfig

    moe = {}
    if L.num_experts:
        moe = dict(num_moe_experts=L.num_experts, moe_router_topk=L.topk, moe_ffn_hidden_size=L.moe_ffn_hidden_size,
                   moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                   moe_token_dispatcher_type="alltoall", moe_grouped_gemm=L.expert_layout != "sequential",
                   moe_router_pre_softmax=False, moe_router_dtype="fp32")
    return TransformerConfig(
        num_layers=L.num_layers, hidden_size=L.hidden_size, num_attention_heads=L.num_heads,
        num_query_groups=L.num_kv_heads, kv_channels=L.head_dim, ffn_hidden_size=L.ffn_hidden_size,
        normalization="RMSNorm", layernorm_epsilon=rms_eps, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp, context_parallel_size=cp, expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.expert_tp,
        sequence_parallel=par.tp > 1 if sequence_parallel is None else sequence_parallel, bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        attention_softmax_in_fp32=True, **moe)


@dataclass
class _Batch:
    input_ids: torch.Tensor  # [B, S]
    position_ids: torch.Tensor  # [B, S]
    targets: torch.Tensor  # [B, S] token predicted at each position (0 where nothing is predicted)
    mask: torch.Tensor  # [B, S] 1 where the position predicts a response token
    fields: dict  # name -> [B, S] float, position-aligned


def _place(values: list[torch.Tensor], starts: list[int], B: int, S: int) -> torch.Tensor:
    out = torch.zeros(B, S)
    for i, (v, s) in enumerate(zip(values, starts)):
        out[i, s: s + len(v)] = v.float()
    return out


class MegatronTrainer:
    """Same surface as TorchTrainer; holds this rank's GPTModel shard, Megatron DDP and optimizer."""

    def __init__(self, hf_config, hf_state: dict[str, torch.Tensor] | None, pad_id: int, cfg, *,
                 parallel: Parallel = Parallel(), cp: int = 1, bf16: bool = False, seed: int = 0,
                 sequence_parallel: bool | None = None, timeout_s: float | None = None):
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.models.gpt import GPTModel
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        if getattr(getattr(cfg, "moe", None), "r3", False):
            raise NotImplementedError("moe.r3: routing replay is implemented in the torch trainer only; the Megatron "
                                      "trainer would need the recorded experts fed to its router")
        if not _te_available():
            _patch_missing_te_gemm()
        if cp > 1 and cfg.algorithm.loss_agg != "token-mean":
            raise ValueError("training.cp > 1 needs algorithm.loss_agg=token-mean (per-sequence means span CP ranks)")
        te = _te_available()
        sp = parallel.tp > 1 if sequence_parallel is None else sequence_parallel
        if sp and not te:
            # megatron-core's local spec normalises with WrappedTorchNorm, which asserts "sequence parallel not
            # supported by torch LayerNorm" (seen on the CPU run of TP 2 + SP); TE's fused norms support it.
            raise ValueError("sequence_parallel needs Transformer Engine (megatron-core's torch norms refuse it); "
                             "install transformer-engine or set training.parallel.sequence_parallel: false")
        self.L = QwenLayout.from_hf_config(hf_config, tp=parallel.tp, fused_norms=te,
                                           expert_layout="te_grouped" if te else "sequential")
        parallel.check(self.L)
        self.par, self.cp, self.cfg, self.pad_id = parallel, cp, cfg, pad_id
        init_distributed(parallel, cp, seed, timeout_s)
        c = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        self.tcfg = transformer_config(self.L, parallel, cp, rms_eps=c.get("rms_norm_eps", 1e-6), bf16=bf16,
                                       sequence_parallel=sequence_parallel)
        if te:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec as spec_fn

            spec = spec_fn(num_experts=self.L.num_experts or None, moe_grouped_gemm=bool(self.L.num_experts),
                           qk_layernorm=True)
        else:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec as spec_fn

            spec = spec_fn(num_experts=self.L.num_experts or None, qk_layernorm=True)
        rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 1_000_000)
        model = GPTModel(config=self.tcfg, transformer_layer_spec=spec, vocab_size=self.L.padded_vocab,
                         max_sequence_length=c.get("max_position_embeddings", 40960),
                         pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
                         share_embeddings_and_output_weights=self.L.tie_embeddings, position_embedding_type="rope",
                         rotary_base=int(rope)).cuda()
        if bf16:
            from megatron.core.transformer.module import Float16Module

            model = Float16Module(self.tcfg, model)
        self.rank_key = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(),
                         ps.get_expert_model_parallel_rank())
        if hf_state is not None:
            self.load_hf(hf_state, model)
        self.model = DistributedDataParallel(config=self.tcfg, ddp_config=DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False), module=model)
        t = cfg.training
        self.opt = get_megatron_optimizer(OptimizerConfig(
            optimizer="adam", lr=t.lr, weight_decay=t.weight_decay, adam_beta1=t.betas[0], adam_beta2=t.betas[1],
            clip_grad=t.grad_clip, bf16=bf16, params_dtype=self.tcfg.params_dtype), [self.model])
        check_config(cfg.algorithm)
        self.loss_fn = get_policy_loss(cfg.algorithm.policy_loss)
        self.temperature = cfg.rollout.temperature
        self.dp_size = ps.get_data_parallel_world_size()

    # --- weights ------------------------------------------------------------------------------------------
    def _module(self, model=None):
        m = model if model is not None else self.model
        while hasattr(m, "module"):
            m = m.module
        return m

    @torch.no_grad()
    def load_hf(self, hf_state: dict[str, torch.Tensor], model=None) -> None:
        """Load this rank's shard of HF checkpoint-named weights into the GPTModel."""
        mine = shard(hf_to_megatron(hf_state, self.L), self.L, self.par)[self.rank_key]
        module = self._module(model)
        res = module.load_state_dict({k: v for k, v in mine.items()}, strict=False)
        missing = [k for k in res.missing_keys if not k.endswith("_extra_state")]
        if missing or res.unexpected_keys:
            raise RuntimeError(f"Megatron state mismatch: missing {missing[:5]}, unexpected {res.unexpected_keys[:5]}")

    @torch.no_grad()
    def hf_state(self, device: str = "cpu") -> dict[str, torch.Tensor] | None:
        """All ranks' shards gathered to global rank 0 and converted to HF names (None on other ranks)."""
        import torch.distributed as dist

        local = {k: v.detach().to(device) for k, v in self._module().state_dict().items()
                 if not k.endswith("_extra_state") and v is not None}
        world = dist.get_world_size()
        if world == 1:
            return megatron_to_hf(merge({self.rank_key: local}, self.L, self.par), self.L)
        gathered = [None] * world if dist.get_rank() == 0 else None
        dist.gather_object((self.rank_key, {k: v.cpu() for k, v in local.items()}), gathered, dst=0)
        if dist.get_rank() != 0:
            return None
        shards = {}
        for key, sd in gathered:
            shards.setdefault(key, sd)  # data-parallel replicas hold the same shard
        return megatron_to_hf(merge(shards, self.L, self.par), self.L)

    # --- batches --------------------------------------------------------------------------------------------
    def _batch(self, prompts, responses, fields: dict[str, list[torch.Tensor]]) -> _Batch:
        B = len(prompts)
        S = max(len(p) + len(r) for p, r in zip(prompts, responses))
        mult = 2 * self.cp * (self.par.tp if self.par.tp > 1 else 1)
        S = -(-S // mult) * mult
        ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        targets = torch.zeros((B, S), dtype=torch.long)
        mask = torch.zeros((B, S))
        starts = []
        for i, (p, r) in enumerate(zip(prompts, responses)):
            n, m = len(p), len(r)
            ids[i, :n] = p
            ids[i, n: n + m] = r
            targets[i, n - 1: n + m - 1] = r
            mask[i, n - 1: n + m - 1] = 1.0
            starts.append(n - 1)
        pos = torch.arange(S).expand(B, S).contiguous()
        placed = {k: _place(v, starts, B, S) for k, v in fields.items()}
        return _Batch(ids, pos, targets, mask, placed)

    def _cp_split(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.cp == 1:
            return tensors
        from megatron.core.utils import get_batch_on_this_cp_rank

        return get_batch_on_this_cp_rank(dict(tensors))

    def _log_probs_of(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T)[target] with the vocabulary split over TP ranks and its padding masked out."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = logits.float() / self.temperature
        per_rank = self.L.padded_vocab // self.par.tp
        start = ps.get_tensor_model_parallel_rank() * per_rank
        first_pad = self.L.vocab_size - start
        if first_pad < per_rank:
            logits = logits.clone()
            logits[..., max(first_pad, 0):] = -1e30
        return -vocab_parallel_cross_entropy(logits, targets)

    def _forward(self, batch: dict, forward_only: bool, scale: LossScale | None, weight: float = 1.0):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        b = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
        B, S = b["input_ids"].shape
        out: dict = {}

        def loss_func(output):
            logp = self._log_probs_of(output, b["targets"]) * b["mask"]
            if forward_only:
                out["log_probs"] = logp.detach()
                return torch.zeros((), device=logp.device), {}
            a = self.cfg.algorithm
            loss, metrics = self.loss_fn(logp, b["old_log_probs"], b["advantages"], b["mask"], a, loss_scale=scale,
                                         rollout_log_probs=b.get("rollout_log_probs"))
            if a.kl_coef > 0 and "ref_log_probs" in b:
                kl = kl_penalty(logp, b["ref_log_probs"], a.kl_estimator)
                loss = loss + a.kl_coef * aggregate(kl, b["mask"], a.loss_agg, scale)
                metrics["kl"] = float((kl.detach() * b["mask"]).sum() / b["mask"].sum().clamp(min=1))
            metrics["loss"] = float(loss.detach())
            metrics["mask_tokens"] = float(b["mask"].sum())  # this rank's tokens (its CP chunk): a group's weights
            out["metrics"] = metrics
            return loss * (self.dp_size * weight), {}

        def step_func(data_iterator, model):
            d = next(data_iterator)
            return model(d["input_ids"], d["position_ids"], None), loss_func

        saved = self.tcfg.finalize_model_grads_func
        self.tcfg.finalize_model_grads_func = None  # grads are reduced once, in step()
        try:
            get_forward_backward_func()(forward_step_func=step_func, data_iterator=iter([b]), model=[self.model],
                                        num_microbatches=1, seq_length=S // self.cp, micro_batch_size=B,
                                        forward_only=forward_only)
        finally:
            self.tcfg.finalize_model_grads_func = saved
        return out

    # --- TorchTrainer interface -----------------------------------------------------------------------------
    @torch.no_grad()
    def log_probs(self, prompts, responses, token_budget: int, routing=None, inputs=None) -> list[torch.Tensor] | None:
        """Per-token log-probs of each response (None on ranks that are not the last pipeline stage)."""
        if routing or inputs:
            raise NotImplementedError("the Megatron trainer takes no routing replay or media inputs")
        from megatron.core import parallel_state as ps

        self.model.eval()
        result: list[torch.Tensor] = []
        for lo, hi in budget_slices([len(p) + len(r) for p, r in zip(prompts, responses)], token_budget):
            bt = self._batch(prompts[lo:hi], responses[lo:hi], {})
            full = {"input_ids": bt.input_ids, "position_ids": bt.position_ids, "targets": bt.targets, "mask": bt.mask}
            out = self._forward(self._cp_split(full), True, None)
            if not ps.is_pipeline_last_stage():
                continue
            lp = self._cp_gather(out["log_probs"]).cpu()
            for i, (p, r) in enumerate(zip(prompts[lo:hi], responses[lo:hi])):
                result.append(lp[i, len(p) - 1: len(p) - 1 + len(r)].clone())
        self.model.train()
        return result if ps.is_pipeline_last_stage() else None

    def _cp_gather(self, local: torch.Tensor) -> torch.Tensor:
        """Undo Megatron's CP split: rank r holds chunks r and 2 CP - 1 - r of the sequence."""
        if self.cp == 1:
            return local
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        parts = [torch.empty_like(local) for _ in range(self.cp)]
        dist.all_gather(parts, local.contiguous(), group=ps.get_context_parallel_group())
        chunks = [None] * (2 * self.cp)
        for r, part in enumerate(parts):
            a, b = part.chunk(2, dim=1)
            chunks[r], chunks[2 * self.cp - 1 - r] = a, b
        return torch.cat(chunks, dim=1)

    def accumulate(self, mb: dict, scale: LossScale) -> dict[str, float]:
        """Forward + backward of one micro-batch; gradients accumulate until `step()`. `mb["loss_weight"]` 0: a
        placeholder row that adds nothing (a data-parallel rank with no row of this micro-batch still runs its
        forward and backward, so the collectives of expert / pipeline parallelism match); no metrics then."""
        weight = float(mb.get("loss_weight", 1.0))
        fields = {"old_log_probs": mb["old_log_probs"], "advantages": mb["advantages"]}
        for k in ("rollout_log_probs", "ref_log_probs"):
            if k in mb:
                fields[k] = mb[k]
        bt = self._batch(mb["prompt_ids"], mb["response_ids"], fields)
        full = {"input_ids": bt.input_ids, "position_ids": bt.position_ids, "targets": bt.targets, "mask": bt.mask,
                **bt.fields}
        out = self._forward(self._cp_split(full), False, scale, weight)
        return out.get("metrics", {}) if weight else {}

    def describe(self) -> str:
        """The backend and layout, for summary.json."""
        import torch.distributed as dist

        dev = "CUDA" if torch.cuda.is_available() else "CPU, megatron-core emulated"
        return (f"megatron ({dist.get_world_size()} rank(s), {dev}: TP {self.par.tp}, PP {self.par.pp}, CP {self.cp}, "
                f"EP {self.par.ep}, DP {self.dp_size})")

    def optimizer_state(self) -> dict:
        return self.opt.state_dict()

    def load_optimizer_state(self, state: dict) -> None:
        self.opt.load_state_dict(state)

    def divide_grads(self, denom: float) -> None:
        """Divide the accumulated gradients (Megatron DDP's grad buffers) by the step's loss denominator."""
        self.model.scale_gradients(1.0 / denom)

    @torch.no_grad()
    def sync_hf(self, model) -> int:
        """Copy the trained weights into a transformers model of the same config (what DCS publishes and
        checkpoints); every rank must call it (the shards are gathered to rank 0, which copies)."""
        from relax.trainers.megatron.convert import copy_hf_into_model

        state = self.hf_state()
        return copy_hf_into_model(model, state) if state is not None else 0

    def step(self, skip: bool = False) -> dict[str, float]:
        """Every rank: finalize the gradients and step; with `skip` (the loss was not finite) or a non-finite
        gradient on any rank, drop the gradients instead (parameters and optimizer state unchanged)."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])
        if skip or not self._grads_finite():
            ok, grad_norm = False, float("nan")
        else:
            ok, grad_norm, _ = self.opt.step()
        self.opt.zero_grad()
        self.model.zero_grad_buffer()
        return {"grad_norm": float(grad_norm) if grad_norm is not None else float("nan"), "update_ok": bool(ok),
                "skipped_nonfinite": int(not ok)}

    def _grads_finite(self) -> bool:
        """Whether every rank's gradient buffers are finite (one all-reduce, so that all ranks agree)."""
        bufs = [*getattr(self.model, "buffers", []), *getattr(self.model, "expert_parallel_buffers", [])]
        bad = torch.zeros(1, dtype=torch.float32, device=bufs[0].grad_data.device if bufs else "cpu")
        for b in bufs:
            bad += (~torch.isfinite(b.grad_data)).any().float()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        return float(bad) == 0


def build_rank_trainer(cfg, hf_config, hf_state, pad_id: int, role: str = "actor",
                       timeout_s: float | None = None) -> MegatronTrainer:
    """This process's MegatronTrainer for `role` from the experiment config (a group's rank: RANK / WORLD_SIZE /
    MASTER_* already in the environment; none: a world of one)."""
    from relax.config import role_parallel

    p = role_parallel(cfg, role)
    return MegatronTrainer(hf_config, hf_state, pad_id, cfg,
                           parallel=Parallel(tp=p.tensor, pp=p.pipeline, ep=p.expert, etp=p.expert_tensor),
                           cp=p.context, sequence_parallel=p.sequence_parallel, seed=cfg.seed,
                           bf16=cfg.training.precision == "bf16", timeout_s=timeout_s)


__all__ = ["MegatronTrainer", "build_rank_trainer", "init_distributed", "megatron_available", "megatron_importable", "transformer_config"]

