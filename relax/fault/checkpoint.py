"""The Actor's periodic checkpoint (health.checkpoint_every): its optimizer state and weights, each written
atomically (a temporary file, then a rename), so a crash mid-write leaves the previous checkpoint whole. One
function, used by the Actor and by `relax profile`, which times it for the simulator's checkpoint cost."""

from __future__ import annotations

from pathlib import Path

import torch

OPTIMIZER = "optimizer.pt"
WEIGHTS = "weights.pt"


def write_checkpoint(folder: Path, version: int, optimizer_state: dict, weights: dict) -> int:
    """Write the optimizer state (tagged with the weight `version` it leads to) and the weights; the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, obj in ((OPTIMIZER, {"version": version, "optimizer": optimizer_state}), (WEIGHTS, weights)):
        tmp = folder / f".{name}.tmp"
        torch.save(obj, tmp)
        written += tmp.stat().st_size
        tmp.replace(folder / name)
    return written
