"""A fixed probe batch for checking a Megatron trainer against the torch trainer (the CPU and GPU tests): three
short arithmetic prompts, random responses from a seeded generator, and a micro-batch with advantages +1, -1 and
0.5 whose old log-probs are the reference trainer's (ratios 1)."""

from __future__ import annotations

import torch

PROMPTS = ("What is 3 + 4? Answer:", "12-5=", "7*6 is")


def probe_batch(tok, seed: int = 1) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.tensor(tok.encode(s)) for s in PROMPTS]
    responses = [torch.randint(3, 90, (n,), generator=gen) for n in (7, 4, 9)]
    return prompts, responses


def probe_micro_batch(prompts, responses, old_log_probs) -> dict:
    return {"prompt_ids": prompts, "response_ids": responses, "old_log_probs": [a.clone() for a in old_log_probs],
            "advantages": [torch.full((len(r),), a) for r, a in zip(responses, (1.0, -1.0, 0.5))]}


def compare_with_torch(cfg, single_row: bool = False) -> dict:
    """Build the Actor's Megatron trainer for `cfg` (`build_megatron_trainer`: one rank or a MegatronGroup) and the
    torch trainer from the same weights, run the probe batch through both (log-probs, one accumulate -> divide ->
    step, log-probs again, the trained weights gathered into a transformers model) and return how far they are
    apart. `single_row`: a second micro-batch of one row (a data-parallel rank without a row of it runs a
    placeholder). Runs in a fresh process (it joins a torch.distributed group)."""
    import copy

    from relax.algorithms import LossScale
    from relax.models import build_model
    from relax.trainers import TorchTrainer, compute_log_probs
    from relax.trainers.factory import build_megatron_trainer
    from relax.trainers.megatron.group import MegatronGroup

    hf, tok = build_model(cfg.model, 0)
    pad = tok.pad_token_id
    ref = TorchTrainer(copy.deepcopy(hf), pad, cfg)
    tr = build_megatron_trainer(cfg, copy.deepcopy(hf), pad)
    prompts, responses = probe_batch(tok)
    lp, lp_ref = tr.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
    mb = probe_micro_batch(prompts, responses, lp_ref)
    one = probe_micro_batch(prompts[:1], responses[:1], lp_ref[:1])
    out: dict = {}
    for key, t in (("megatron", tr), ("torch", ref)):
        m = t.accumulate(mb, LossScale(total_tokens=1, total_seqs=1))
        if single_row:
            m1 = t.accumulate(one, LossScale(total_tokens=1, total_seqs=1))
            m = {**m, "loss_single_row": m1.get("loss")}
        t.divide_grads(20)
        out[key] = {**m, **t.step()}
    after, after_ref = tr.log_probs(prompts, responses, 4096), ref.log_probs(prompts, responses, 4096)
    mirror = copy.deepcopy(hf)
    tr.sync_hf(mirror)
    diff = lambda a, b: max(float((x.cpu() - y.cpu()).abs().max()) for x, y in zip(a, b))  # noqa: E731
    res = {"is_group": isinstance(tr, MegatronGroup), "describe": tr.describe(), "metrics": out,
           "err_before": diff(lp, lp_ref), "err_after": diff(after, after_ref), "moved": diff(after_ref, lp_ref),
           "err_mirror": diff(compute_log_probs(mirror, pad, prompts, responses, cfg.rollout.temperature, 4096),
                              after_ref)}
    if isinstance(tr, MegatronGroup):
        state = tr.optimizer_state()
        tr.load_optimizer_state(state)
        try:
            tr.load_optimizer_state({**state, "world": state["world"] + 1})
            res["refused_other_layout"] = False
        except ValueError:
            res["refused_other_layout"] = True
    return res


def step_after_a_rank_dies(cfg) -> str:
    """Build the Actor's MegatronGroup, kill its rank 1, then train a step: the group must end this process (so a
    supervisor sees the role die and restarts it) instead of waiting in a collective. Returns only if it did not."""
    import copy

    import ray

    from relax.algorithms import LossScale
    from relax.models import build_model
    from relax.trainers.factory import build_megatron_trainer

    hf, tok = build_model(cfg.model, 0)
    tr = build_megatron_trainer(cfg, copy.deepcopy(hf), tok.pad_token_id)
    prompts, responses = probe_batch(tok)
    mb = probe_micro_batch(prompts, responses, [torch.zeros(len(r)) for r in responses])
    tr.accumulate(mb, LossScale(total_tokens=1, total_seqs=1))  # a healthy group trains
    ray.kill(tr.workers[0])
    tr.accumulate(mb, LossScale(total_tokens=1, total_seqs=1))
    tr.step()
    return "still alive"
