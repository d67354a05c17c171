"""Routing replay in the trainer (R3, arXiv 2510.11370).

`replay_routing(model, experts, mask)` patches each MoE router of `model` for the forwards run inside it:
for every token where `mask` is set, the expert set is the recorded one, and the gate weights come from the
router's own logits s renormalised over that set,

    g_i = I_i exp(s_i) / sum_j I_j exp(s_j)        (I_i = 1 if expert i is in the recorded set),

computed as p_i / sum_{j in set} p_j with p = softmax(s): the same arithmetic the unpatched Qwen3-MoE router
uses for its own top-k set (`norm_topk_prob`), so unmasked tokens route exactly as without the patch and the
router weight still gets gradients through g. Routers with `norm_topk_prob = False` keep p_i unnormalised,
as they do for their own choice.

The patch is an instance attribute `forward` on each router (transformers 5.23's `Qwen3MoeTopKRouter`, whose
forward returns `(router_logits, routing_weights, selected_experts)` to `Qwen3MoeSparseMoeBlock`); hooks and
output recorders on the router keep working, and leaving the context removes it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from relax.moe.capture import NOT_ROUTED, moe_routers
from relax.moe.fields import ROUTED_FIELD


def _replay_forward(router, experts: torch.Tensor, mask: torch.Tensor, hidden_states: torch.Tensor):
    hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    if hidden_states.shape[0] != experts.shape[0]:
        raise ValueError(f"routing replay: the forward routes {hidden_states.shape[0]} tokens but "
                         f"{experts.shape[0]} were prepared (replay_routing must wrap a forward of that batch)")
    logits = F.linear(hidden_states, router.weight)
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    _, own = torch.topk(probs, router.top_k, dim=-1)
    idx = torch.where(mask[:, None], experts, own)
    gates = probs.gather(-1, idx)
    if router.norm_topk_prob:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return logits, gates.to(logits.dtype), idx


@contextlib.contextmanager
def replay_routing(model, experts: torch.Tensor, mask: torch.Tensor):
    """Forwards inside use `experts` ([B, L, layers, k], int) where `mask` ([B, L], bool) is set."""
    routers = moe_routers(model)
    if experts.shape[2] != len(routers):
        raise ValueError(f"routing replay: {experts.shape[2]} recorded MoE layers, the model has {len(routers)}")
    B, L, layers, k = experts.shape
    flat = experts.reshape(B * L, layers, k).to(torch.long)
    flat_mask = mask.reshape(B * L)
    try:
        for i, r in enumerate(routers):
            if k != r.top_k:
                raise ValueError(f"routing replay: recorded top-{k}, the model routes top-{r.top_k}")
            e = flat[:, i]
            r.forward = lambda hs, r=r, e=e: _replay_forward(r, e, flat_mask, hs)
        yield
    finally:
        for r in routers:
            r.__dict__.pop("forward", None)


def build_replay(prompt_lens: list[int], response_lens: list[int], width: int, routes: list[torch.Tensor],
                 num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The recorded experts laid over right-padded prompt+response rows of `width` tokens:
    `(experts [B, width, layers, k] int64, mask [B, width] bool)`. A row's record covers prompt + response
    (length P + R) or the response alone (length R, placed at P); NOT_ROUTED entries, padding and an
    unrecorded prompt are left to the trainer's own router."""
    ref = next((t for t in routes if t.numel()), None)
    B = len(routes)
    layers, k = (ref.shape[1], ref.shape[2]) if ref is not None else (0, 0)
    experts = torch.zeros((B, width, layers, k), dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.bool)
    if ref is None:
        return experts, mask
    starts = []
    for i, (p, m, rec) in enumerate(zip(prompt_lens, response_lens, routes)):
        T = rec.shape[0]
        if T != p + m and T != m:
            raise ValueError(f"{ROUTED_FIELD}: row {i} has {T} entries for a {p}-token prompt and {m}-token response "
                             f"(expected {p + m}, or {m} without the prompt)")
        starts.append(0 if T == p + m else p)
    # One scatter for the whole batch: entry j of row i goes to position starts[i] + j.
    lens = torch.tensor([rec.shape[0] for rec in routes])
    row = torch.repeat_interleave(torch.arange(B), lens)
    first = torch.cumsum(lens, 0) - lens
    pos = torch.arange(int(lens.sum())) - torch.repeat_interleave(first - torch.tensor(starts), lens)
    experts[row, pos] = torch.cat(list(routes)).to(torch.long)
    mask[row, pos] = True
    sentinel = NOT_ROUTED.get(ref.dtype, -1)
    mask &= ~(experts == sentinel).all(-1).all(-1)
    bad = mask[..., None, None] & ((experts < 0) | (experts >= num_experts))
    if bool(bad.any()):
        raise ValueError(f"{ROUTED_FIELD}: expert index outside [0, {num_experts})")
    experts.masked_fill_(~mask[..., None, None], 0)
    return experts, mask


def replay_from_batch(model, data: dict, width: int, rows: slice | None = None):
    """The replay context for a micro-batch dict holding `rollout_routed_experts`, packed right-padded to
    `width` tokens; a no-op context when it holds none."""
    if ROUTED_FIELD not in data:
        return contextlib.nullcontext()
    rows = rows or slice(None)
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"{ROUTED_FIELD}: routing replay needs an MoE model (moe.r3 with a dense model.kind)")
    experts, mask = build_replay([len(p) for p in data["prompt_ids"][rows]],
                                 [len(r) for r in data["response_ids"][rows]], width, data[ROUTED_FIELD][rows],
                                 int(routers[0].num_experts))
    return replay_routing(model, experts, mask)
