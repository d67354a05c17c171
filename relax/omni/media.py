"""Offline media for the omni tasks: real handwritten digits, synthesized digit sounds, muxed videos.

* Images: scikit-learn's `load_digits` (1797 real 8x8 handwritten digits, 0..16 grey levels), referenced
  as `digits://<index>`.
* Audio: each digit is a DTMF telephone tone (the two-frequency code a keypad sends), with a seeded random
  level, frequency jitter and noise. This is a synthesized signal, NOT speech: no text-to-speech engine ships
  as a pure-Python package here (Debian's espeak-ng would need apt). Referenced as `dtmf://<digit>/<seed>`.
* Video: a short MP4 muxed with PyAV (MPEG-4 video of a digit image, upscaled, plus an AAC soundtrack of a
  DTMF digit), written once to a cache folder and referenced by its path.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

SR = 16_000  # audio sample rate
TONE_S = 0.3
_DTMF = {1: (697, 1209), 2: (697, 1336), 3: (697, 1477), 4: (770, 1209), 5: (770, 1336), 6: (770, 1477),
         7: (852, 1209), 8: (852, 1336), 9: (852, 1477), 0: (941, 1336)}


@functools.lru_cache(maxsize=1)
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(images [1797, 8, 8] float32 in 0..16, labels [1797] int)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32), d.target.astype(np.int64)


def dtmf(digit: int, seed: int, seconds: float = TONE_S, sr: int = SR) -> np.ndarray:
    """The DTMF tone of `digit` with seeded level, +-1.5% frequency jitter, onset and noise; float32 [n]."""
    rng = np.random.default_rng(seed)
    lo, hi = _DTMF[int(digit)]
    n = int(seconds * sr)
    t = np.arange(n) / sr
    j = 1 + rng.uniform(-0.015, 0.015, 2)
    wave = np.sin(2 * np.pi * lo * j[0] * t) + np.sin(2 * np.pi * hi * j[1] * t + rng.uniform(0, 2 * np.pi))
    start = int(rng.uniform(0, 0.2) * n)
    wave[:start] = 0.0
    wave = wave * rng.uniform(0.2, 0.5) + rng.normal(0, rng.uniform(0.01, 0.1), n)
    return wave.astype(np.float32)


def resolve_image(uri: str) -> np.ndarray:
    if not uri.startswith("digits://"):
        raise ValueError(f"unknown image uri {uri!r} (expected digits://<index>)")
    return digits()[0][int(uri[len("digits://"):])]


def resolve_audio(uri: str) -> np.ndarray:
    if not uri.startswith("dtmf://"):
        raise ValueError(f"unknown audio uri {uri!r} (expected dtmf://<digit>/<seed>)")
    d, s = uri[len("dtmf://"):].split("/")
    return dtmf(int(d), int(s))


def video_dir() -> Path:
    root = Path(os.environ.get("RELAX_CACHE", Path.home() / ".cache" / "relax"))
    return root / "omni" / "videos"


def write_video(path: Path, image: np.ndarray, audio: np.ndarray, fps: int = 4, frames: int = 4, scale: int = 4) -> Path:
    """Mux an MP4: `frames` frames of `image` (0..16, upscaled x`scale`, slightly shifted per frame) and
    `audio` as an AAC track. Written atomically."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.mp4")
    big = np.kron(image / 16.0 * 255.0, np.ones((scale, scale))).clip(0, 255).astype(np.uint8)
    H, W = big.shape
    with av.open(str(tmp), "w") as out:
        vs = out.add_stream("mpeg4", rate=fps)
        vs.width, vs.height, vs.pix_fmt = W, H, "yuv420p"
        vs.bit_rate = 400_000
        as_ = out.add_stream("aac", rate=SR)
        as_.layout = "mono"
        for f in range(frames):
            frame = av.VideoFrame.from_ndarray(np.roll(big, f % 2, axis=1), format="gray")
            for pkt in vs.encode(frame.reformat(format="yuv420p")):
                out.mux(pkt)
        for pkt in vs.encode():
            out.mux(pkt)
        chunk = 1024
        for lo in range(0, len(audio), chunk):
            a = audio[lo:lo + chunk][None, :].astype(np.float32)
            af = av.AudioFrame.from_ndarray(a, format="fltp", layout="mono")
            af.sample_rate = SR
            af.pts = lo
            for pkt in as_.encode(af):
                out.mux(pkt)
        for pkt in as_.encode():
            out.mux(pkt)
    tmp.replace(path)
    return path


def read_video(path: str | Path, scale: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Decode an MP4: (frames [F, 8, 8] float32 in 0..16 after averaging `scale`x`scale` blocks,
    audio [n] float32 mono at SR)."""
    import av

    frames, audio = [], []
    with av.open(str(path)) as inp:
        for frame in inp.decode(video=0):
            g = frame.to_ndarray(format="gray").astype(np.float32)
            H, W = g.shape
            g = g[: H - H % scale, : W - W % scale].reshape(H // scale, scale, W // scale, scale).mean((1, 3))
            frames.append(g / 255.0 * 16.0)
    with av.open(str(path)) as inp:
        for frame in inp.decode(audio=0):
            a = frame.to_ndarray()
            audio.append(a.reshape(a.shape[0], -1).mean(0) if frame.format.is_planar else a.reshape(-1))
    if not frames:
        raise ValueError(f"{path}: no video frames")
    return np.stack(frames).astype(np.float32), (np.concatenate(audio) if audio else np.zeros(0)).astype(np.float32)
