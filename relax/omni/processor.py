"""The omni processor: raw media (by URI or path) -> model features, one bus field per modality.

Fields it produces, one entry per row (rows without that modality get a zero-length tensor):
  image_patches  float32 [n_images * 4, 16]  each 8x8 image cut into four 4x4 patches, scaled to 0..1
  audio_mel      float32 [frames, 32]        log-mel spectrogram (torch STFT + a mel filterbank built here)
  video_frames   float32 [F, 8, 8]           decoded video frames (the video's soundtrack goes to audio_mel)
  media_uri      str                         the media the row refers to ("|"-separated); never the bytes
Prompt ids hold one placeholder token per feature token (tokenizer.IMAGE / AUDIO / VIDEO), in the order the
model fills them.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from relax.omni.media import SR, read_video, resolve_audio, resolve_image

N_MELS = 32
N_FFT = 400
HOP = 160
PATCH = 4
AUDIO_TOKENS = 4  # the audio encoder pools any clip to this many tokens
FIELDS = ("image_patches", "audio_mel", "video_frames")


@functools.lru_cache(maxsize=4)
def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sr: int = SR) -> torch.Tensor:
    """HTK-style triangular mel filters, [n_fft // 2 + 1, n_mels]."""
    def hz_to_mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)

    mels = torch.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    freqs = torch.linspace(0, sr / 2, n_fft // 2 + 1)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).T.contiguous()


def log_mel(wave: np.ndarray | torch.Tensor) -> torch.Tensor:
    """[frames, N_MELS] log-mel features of a mono waveform at SR."""
    w = torch.as_tensor(np.asarray(wave, dtype=np.float32))
    if w.numel() < N_FFT:
        w = torch.nn.functional.pad(w, (0, N_FFT - w.numel()))
    spec = torch.stft(w, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True).abs() ** 2
    return torch.log(spec.T @ mel_filterbank() + 1e-6).float()


def image_patches(img: np.ndarray) -> torch.Tensor:
    """[4, 16] patches of an 8x8 image in 0..16, scaled to 0..1, row-major patch order."""
    x = torch.as_tensor(np.asarray(img, dtype=np.float32)) / 16.0
    if x.shape != (8, 8):
        raise ValueError(f"image must be 8x8, got {tuple(x.shape)}")
    return x.reshape(2, PATCH, 2, PATCH).permute(0, 2, 1, 3).reshape(4, PATCH * PATCH).contiguous()


@functools.lru_cache(maxsize=4096)
def audio_features(uri: str) -> torch.Tensor:
    """Log-mel of the clip a URI names, computed once per process (URIs are deterministic)."""
    return log_mel(resolve_audio(uri))


@functools.lru_cache(maxsize=256)
def video_features(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(frames [F, 8, 8], soundtrack log-mel [T, N_MELS]) of a video file, decoded once per process."""
    frames, track = read_video(path)
    return torch.as_tensor(frames), log_mel(track)


class OmniProcessor:
    """Turns a row's media references into its feature fields and prompt ids."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def features(self, media: dict[str, str]) -> dict[str, torch.Tensor]:
        """media: {"image": uri, "audio": uri, "video": path} (any subset)."""
        img = torch.zeros(0, PATCH * PATCH)
        mel = torch.zeros(0, N_MELS)
        vid = torch.zeros(0, 8, 8)
        if "image" in media:
            img = image_patches(resolve_image(media["image"]))
        if "audio" in media:
            mel = audio_features(media["audio"])
        if "video" in media:
            if "audio" in media:
                raise ValueError("a row has either an audio clip or a video soundtrack, not both")
            vid, mel = video_features(media["video"])
        return {"image_patches": img, "audio_mel": mel, "video_frames": vid}

    def prompt_ids(self, feats: dict[str, torch.Tensor], text: str) -> list[int]:
        t = self.tok
        ids = [t.bos_token_id]
        ids += [t.IMAGE] * feats["image_patches"].shape[0]
        ids += [t.VIDEO] * (feats["video_frames"].shape[0] * 4)
        ids += [t.AUDIO] * (AUDIO_TOKENS if feats["audio_mel"].shape[0] else 0)
        return ids + t.encode(text, add_bos=False)

    def rows(self, items: list[dict]) -> dict:
        """Bus fields for rows {"media": {...}, "text": str}."""
        feats = [self.features(it["media"]) for it in items]
        out = {k: [f[k] for f in feats] for k in FIELDS}
        out["prompt_ids"] = [torch.tensor(self.prompt_ids(f, it["text"])) for f, it in zip(feats, items)]
        out["media_uri"] = ["|".join(f"{k}={v}" for k, v in sorted(it["media"].items())) for it in items]
        return out
