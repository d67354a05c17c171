"""Omni tasks with exactly known answers, graded by rule.

`digit_sum`: the model sees a handwritten digit (image, scikit-learn digits) and hears a DTMF digit (audio),
or watches a short video whose frames show the digit and whose soundtrack is the DTMF tone; it must answer
the sum (0..18). Train and eval use disjoint digit images (index % 5 == 0 is eval).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from relax.omni.media import digits, dtmf, video_dir, write_video

QUESTION = " sum="


@dataclass(frozen=True)
class OmniItem:
    index: int
    media: dict  # {"image": uri, "audio": uri} or {"video": path}
    text: str
    answer: str
    kind: str  # "image_audio" | "video"


class DigitSumTask:
    def __init__(self, split: str, size: int = 4096, video_every: int = 4, n_videos: int = 16, seed: int = 0,
                 audio_variants: int = 64):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        _, labels = digits()
        self.split, self.size, self.video_every, self.n_videos, self.seed = split, size, video_every, n_videos, seed
        self.pool = [i for i in range(len(labels)) if (i % 5 == 0) == (split == "eval")]
        self.labels = labels
        self.audio_variants = audio_variants  # distinct synthesized renditions of each digit's tone

    def __len__(self) -> int:
        return self.size

    def _draw(self, key: int) -> tuple[int, int, int]:
        rng = random.Random(f"{self.seed}-{self.split}-{key}")
        return rng.choice(self.pool), rng.randrange(10), rng.randrange(self.audio_variants)

    @functools.lru_cache(maxsize=None)
    def __getitem__(self, i: int) -> OmniItem:
        i %= self.size
        if self.video_every and i % self.video_every == self.video_every - 1:
            v = (i // self.video_every) % self.n_videos
            img, b, s = self._draw(-1 - v)
            path = video_dir() / f"digit_sum-{self.seed}-{self.split}-{v}.mp4"
            if not path.exists():
                write_video(path, digits()[0][img], dtmf(b, s))
            return OmniItem(i, {"video": str(path)}, QUESTION, str(int(self.labels[img]) + b), "video")
        img, b, s = self._draw(i)
        return OmniItem(i, {"image": f"digits://{img}", "audio": f"dtmf://{b}/{s}"}, QUESTION,
                        str(int(self.labels[img]) + b), "image_audio")

    @staticmethod
    def score(item: OmniItem, response_text: str) -> float:
        return float(response_text.strip() == item.answer)


PARAMS = {"video_every", "n_videos", "audio_variants"}


def load(cfg, seed: int, split: str):
    """The engine's task loader (relax.tasks, `task.name: digit_sum`, `task.kind: omni`): rows are
    (question text, answer, {"media": {...}, "modality": ...}); the media stay referenced by URI / path."""
    unknown = set(cfg.params) - PARAMS
    if unknown:
        raise ValueError(f"task.params: digit_sum takes {sorted(PARAMS)}, not {sorted(unknown)}")
    size = cfg.size if split == "train" else max(cfg.eval_size, 1)
    t = DigitSumTask(split, size, seed=seed, **{k: int(v) for k, v in cfg.params.items()})

    def row(i: int):
        it = t[i]
        return it.text, it.answer, {"media": dict(it.media), "modality": it.kind}

    return len(t), row
