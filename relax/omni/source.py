"""What the Rollout role generates for non-text tasks (`task.kind` omni or agent), as bus fields.

`make_source(cfg, tokenizer, engine, data)` returns None for text tasks (the role's own prompt path), else an
object whose `rows(prompt_indexes, max_new_tokens)` runs the engine and returns the per-row fields:
  omni:  prompt_ids (with media placeholders), image_patches, audio_mel, video_frames (one field each),
         media_uri (the media by reference, never the bytes), response_ids, rollout_log_probs,
         weight_version, truncated
  agent: relax.agent.source (multi-turn episodes with tools, loss_mask)
The Rollout role adds sample_id, group_id, prompt_index and total_len.
"""

from __future__ import annotations

import torch

from relax.omni.processor import FIELDS, OmniProcessor


class OmniSource:
    def __init__(self, cfg, tokenizer, engine, data):
        self.engine = engine
        self.data = data
        self.proc = OmniProcessor(tokenizer)
        self.cache: dict[int, dict] = {}  # features per prompt index, made once per process

    def features(self, idx: int) -> dict:
        if idx not in self.cache:
            p = self.data[idx]
            got = self.proc.rows([{"media": p.meta["media"], "text": p.prompt}])
            self.cache[idx] = {k: v[0] for k, v in got.items()}
        return self.cache[idx]

    def rows(self, prompt_indexes: list[int], max_new_tokens: int) -> dict:
        feats = [self.features(i) for i in prompt_indexes]
        gens = self.engine.generate([f["prompt_ids"].tolist() for f in feats], max_new_tokens,
                                    media=[{k: f[k] for k in FIELDS} for f in feats])
        out = {k: [f[k] for f in feats] for k in ("prompt_ids", *FIELDS, "media_uri")}
        out.update({
            "response_ids": [torch.tensor(g.token_ids, dtype=torch.long) for g in gens],
            "rollout_log_probs": [torch.tensor(g.log_probs, dtype=torch.float32) for g in gens],
            "weight_version": torch.tensor([g.weight_version for g in gens]),
            "truncated": torch.tensor([int(g.finish_reason == "length") for g in gens]),
        })
        return out


def engine_class(cfg):
    """The rollout engine for `cfg.model`: OmniEngine (generate takes media) for tiny_omni, else TorchEngine."""
    if cfg.model.kind == "tiny_omni":
        from relax.omni.model import OmniEngine

        return OmniEngine
    from relax.engines import TorchEngine

    return TorchEngine


def make_source(cfg, tokenizer, engine, data):
    if cfg.task.kind == "omni":
        return OmniSource(cfg, tokenizer, engine, data)
    if cfg.task.kind == "agent":
        from relax.agent.source import AgentSource

        return AgentSource(cfg, tokenizer, engine, data)
    return None
