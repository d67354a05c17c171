"""Training pieces of the omni runner: packing rows with media, supervised warm-up, GRPO steps.

Rows are bus-shaped dicts of per-row lists (prompt_ids, response_ids, loss_mask, rollout_log_probs, the
media fields). The GRPO loss is the clipped-ratio objective against the rollout log-probs, token-mean over
the loss mask (tool / environment / media tokens excluded), group-normalised advantages.
"""

from __future__ import annotations

import torch

from relax.omni.processor import FIELDS


def pack(prompts, responses, pad_id: int):
    B = len(prompts)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    T = max(max(len(r) for r in responses), 1)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    rid = torch.full((B, T), pad_id, dtype=torch.long)
    valid = torch.zeros((B, T))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n, m = len(p), len(r)
        ids[i, :n], ids[i, n:n + m] = p, r
        attn[i, :n + m] = 1
        pos[i, :m] = torch.arange(n - 1, n + m - 1)
        rid[i, :m] = r
        valid[i, :m] = 1.0
    return ids, attn, pos, rid, valid


def pad_right(seqs, T):
    out = torch.zeros(len(seqs), T)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = s
    return out


def response_log_probs(model, rows: dict, idx: list[int], pad_id: int):
    """(log-probs [B, T], loss mask [B, T]) of the responses of rows `idx`."""
    prompts = [rows["prompt_ids"][i] for i in idx]
    resps = [rows["response_ids"][i] for i in idx]
    ids, attn, pos, rid, valid = pack(prompts, resps, pad_id)
    media = [{k: rows[k][i] for k in FIELDS if k in rows} for i in idx]
    logits = model(input_ids=ids, attention_mask=attn, media=media).logits
    picked = logits.gather(1, pos[..., None].expand(-1, -1, logits.size(-1))).float()
    lp = torch.log_softmax(picked, -1).gather(-1, rid[..., None]).squeeze(-1)
    mask = valid
    if "loss_mask" in rows:
        mask = pad_right([rows["loss_mask"][i] for i in idx], valid.shape[1]) * valid
    return lp * valid, mask


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def sft_loss(model, rows, idx, pad_id):
    lp, mask = response_log_probs(model, rows, idx, pad_id)
    return -(lp * mask).sum() / mask.sum().clamp(min=1)


def grpo_loss(model, rows, idx, adv: torch.Tensor, pad_id: int, clip: float = 0.2):
    lp, mask = response_log_probs(model, rows, idx, pad_id)
    old = pad_right([rows["rollout_log_probs"][i] for i in idx], lp.shape[1])
    ratio = torch.exp((lp - old).clamp(-20, 20))
    a = adv[idx][:, None]
    obj = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    loss = -(obj * mask).sum() / mask.sum().clamp(min=1)
    with torch.no_grad():
        clipfrac = (((ratio - 1).abs() > clip).float() * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"clipfrac": float(clipfrac)}
