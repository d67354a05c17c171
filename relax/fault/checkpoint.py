"""The Actor's periodic checkpoint (health.checkpoint_every): its optimizer state and weights, each written
atomically (a temporary file, then a rename), so a crash mid-write leaves the previous checkpoint whole. The Actor
writes it, `relax profile` times it and the simulator prices it, all by the rules here (torch is imported only to
write: the simulator stays free of it)."""

from __future__ import annotations

from pathlib import Path

OPTIMIZER = "optimizer.pt"
WEIGHTS = "weights.pt"


def checkpoint_due(every: int, step: int) -> bool:
    """Whether the Actor checkpoints after training `step` (every `every` steps; 0: never)."""
    return bool(every) and (step + 1) % every == 0


def write_checkpoint(folder: Path, version: int, optimizer_state: dict, weights: dict) -> int:
    """Write the optimizer state (tagged with the weight `version` it leads to) and the weights; the bytes written."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, obj in ((OPTIMIZER, {"version": version, "optimizer": optimizer_state}), (WEIGHTS, weights)):
        tmp = folder / f".{name}.tmp"
        torch.save(obj, tmp)
        written += tmp.stat().st_size
        tmp.replace(folder / name)
    return written
