"""A tiny omni model trainable on CPU: a tiny Qwen3 language model plus small vision and audio encoders
whose projectors map features into the token embedding space (placeholder tokens are replaced by them).

`media` (one dict per row) carries the processor's fields: image_patches [Ni, 16], audio_mel [T, 32],
video_frames [F, 8, 8]. Placeholder counts in input_ids must match (checked; the error names the field).
"""

from __future__ import annotations

import torch
from torch import nn

from relax.engines.torch_engine import TorchEngine
from relax.omni.processor import AUDIO_TOKENS, N_MELS, PATCH, image_patches
from relax.omni.tokenizer import OmniTokenizer as T


class TinyOmni(nn.Module):
    def __init__(self, lm, enc_dim: int = 64, max_frames: int = 8):
        super().__init__()
        H = lm.config.hidden_size
        self.lm = lm
        self.config = lm.config
        self.vision = nn.Sequential(nn.Linear(PATCH * PATCH, enc_dim), nn.GELU(), nn.Linear(enc_dim, enc_dim), nn.GELU())
        self.vision_proj = nn.Linear(enc_dim, H)
        self.patch_pos = nn.Parameter(torch.zeros(4, H))
        self.frame_pos = nn.Parameter(torch.zeros(max_frames, H))
        self.audio = nn.Sequential(
            nn.Conv1d(N_MELS, enc_dim, 3, padding=1), nn.GELU(),
            nn.Conv1d(enc_dim, enc_dim, 3, stride=2, padding=1), nn.GELU(),
            nn.AdaptiveAvgPool1d(AUDIO_TOKENS),
        )
        self.audio_norm = nn.LayerNorm(N_MELS)
        self.audio_proj = nn.Linear(enc_dim, H)
        self.audio_pos = nn.Parameter(torch.zeros(AUDIO_TOKENS, H))
        self.register_buffer("_no_emit", torch.tensor([T.IMAGE, T.AUDIO, T.VIDEO]), persistent=False)
        self.pending_media = None  # set by OmniEngine for the prefill step of a generate call

    # ---- encoders --------------------------------------------------------------------------------------
    def encode_image(self, patches: torch.Tensor) -> torch.Tensor:  # [4n, 16] -> [4n, H]
        n = patches.shape[0] // 4
        return self.vision_proj(self.vision(patches)) + self.patch_pos.repeat(n, 1)

    def encode_video(self, frames: torch.Tensor) -> torch.Tensor:  # [F, 8, 8] -> [4F, H]
        F = frames.shape[0]
        patches = torch.cat([image_patches(f * 1.0) for f in frames]) if F else frames.new_zeros(0, 16)
        return self.encode_image(patches) + self.frame_pos[:F].repeat_interleave(4, 0)

    def encode_audio(self, mel: torch.Tensor) -> torch.Tensor:  # [T, 32] -> [AUDIO_TOKENS, H]
        x = self.audio_norm(mel).T[None]  # [1, 32, T]
        return self.audio_proj(self.audio(x)[0].T) + self.audio_pos

    def embed(self, input_ids: torch.Tensor, media: list[dict]) -> torch.Tensor:
        emb = self.lm.get_input_embeddings()(input_ids)
        rows = []
        for b, m in enumerate(media):
            e = emb[b]
            ids = input_ids[b]
            parts = []  # (placeholder id, field, feature tokens expected, encoder, features)
            if m.get("image_patches") is not None and m["image_patches"].shape[0]:
                x = m["image_patches"]
                parts.append((T.IMAGE, "image_patches", x.shape[0], self.encode_image, x))
            if m.get("video_frames") is not None and m["video_frames"].shape[0]:
                x = m["video_frames"]
                parts.append((T.VIDEO, "video_frames", 4 * x.shape[0], self.encode_video, x))
            if m.get("audio_mel") is not None and m["audio_mel"].shape[0]:
                parts.append((T.AUDIO, "audio_mel", AUDIO_TOKENS, self.encode_audio, m["audio_mel"]))
            for pid, name, n_tok, enc, x in parts:
                pos = (ids == pid).nonzero().squeeze(-1)
                if pos.numel() != n_tok:
                    raise ValueError(f"row {b}: {pos.numel()} placeholder tokens for {n_tok} '{name}' feature tokens")
                e = e.index_put((pos,), enc(x.to(e.dtype)).to(e.dtype))
            rows.append(e)
        return torch.stack(rows)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                media=None):
        if media is None and past_key_values is None:
            media = self.pending_media
        kw = dict(attention_mask=attention_mask, position_ids=position_ids, past_key_values=past_key_values,
                  use_cache=use_cache)
        if media is not None:
            out = self.lm(inputs_embeds=self.embed(input_ids, media), **kw)
        else:
            out = self.lm(input_ids=input_ids, **kw)
        # Placeholder ids are input-only: the model can never emit one (same distribution in rollout and training).
        out.logits = out.logits.index_fill(-1, self._no_emit, float("-inf"))
        return out


def build_tiny_omni(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                    max_position=256, seed=0) -> TinyOmni:
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=T.vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                      num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                      head_dim=hidden_size // num_heads, intermediate_size=intermediate_size,
                      max_position_embeddings=max_position, tie_word_embeddings=False,
                      pad_token_id=T.pad_token_id, bos_token_id=T.bos_token_id, eos_token_id=T.eos_token_id)
    return TinyOmni(AutoModelForCausalLM.from_config(cfg)).float()


def media_of(item) -> dict:
    """Model media from a feature dict, or from an agent session's MediaRef list (images carried over)."""
    if isinstance(item, dict):
        return item
    imgs = [m.features for m in item if m.kind == "image" and m.features is not None]
    return {"image_patches": torch.cat(imgs) if imgs else None}


class OmniEngine(TorchEngine):
    """TorchEngine whose generate also takes per-row media (features dicts or agent MediaRef lists)."""

    accepts_media = True

    def generate(self, prompts, max_new_tokens, media=None):
        with self._lock:
            if self.asleep:
                raise RuntimeError("engine is asleep: wake() it with weights before generating")
            self.model.pending_media = None if media is None else [media_of(m) for m in media]
            try:
                return self._generate(prompts, max_new_tokens)
            finally:
                self.model.pending_media = None
