"""What every figure module shares: writing a finished matplotlib figure to disk."""

from __future__ import annotations

from pathlib import Path


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Write `fig` to `path` (its folder made if missing), free it, and return the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
