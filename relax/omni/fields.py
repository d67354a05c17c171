"""Which bus fields a model-forward role (Actor, Reference) reads beyond prompt and response ids.

Field-level storage: each medium is its own field of the row, so a role asks only for what it uses. The
Rollout writes them, the Actor and the Reference read them for their forwards; Reward and Advantages never
name them and so never receive pixels, spectrograms or frames (tests/omni/test_omni_engine.py checks the fields
each role actually fetched).
"""

from __future__ import annotations

from relax.omni.processor import FIELDS

MEDIA_FIELDS = list(FIELDS)  # image_patches, audio_mel, video_frames


def input_fields(cfg) -> list[str]:
    """Extra fields a forward over the rows needs under `cfg`: the media of an omni task, the loss mask of
    an agent task (tool and environment tokens are not the model's)."""
    kind = cfg.task.kind
    return MEDIA_FIELDS * (kind == "omni") + ["loss_mask"] * (kind == "agent")
