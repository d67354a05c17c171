"""DCS layout: how one version of the weights is laid out for transfer.

A version is described by its tensor metadata (names, shapes, dtypes) cut into buckets of consecutive
same-dtype tensors; a holder copies its weights into flat per-dtype staging buffers of that layout
(allocated once and reused for every version), and a receiver receives into its own staging of the same
layout, so the buffers move bucket by bucket with no per-tensor messages.
"""

from __future__ import annotations

import threading

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool}


def plan_layout(tensors: dict[str, torch.Tensor], bucket_bytes: int) -> list[dict]:
    """Buckets of consecutive same-dtype tensors, each at most `bucket_bytes` (a bigger tensor gets its own).

    A bucket is {"dtype", "numel", "entries": [(name, offset, numel, shape)]}; it is the unit of transfer."""
    if bucket_bytes <= 0:
        raise ValueError(f"dcs: bucket size must be positive (got {bucket_bytes} bytes)")
    buckets: list[dict] = []
    cur: dict | None = None
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ValueError(f"dcs: tensor '{name}' has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        if cur is None or cur["dtype"] != dtype or (cur["entries"] and cur["bytes"] + nbytes > bucket_bytes):
            cur = {"dtype": dtype, "numel": 0, "bytes": 0, "entries": []}
            buckets.append(cur)
        cur["entries"].append((name, cur["numel"], t.numel(), tuple(t.shape)))
        cur["numel"] += t.numel()
        cur["bytes"] += nbytes
    return buckets


def layout_bytes(layout: list[dict]) -> int:
    return sum(b["bytes"] for b in layout)


class Staging:
    """Flat buckets holding one version of the weights; allocated once per layout and reused."""

    def __init__(self, layout: list[dict], device: str = "cpu"):
        self.layout = layout
        self.device = device
        self.buffers = [torch.empty(b["numel"], dtype=DTYPES[b["dtype"]], device=device) for b in layout]
        self.version = -1
        self.nbytes = layout_bytes(layout)
        self.lock = threading.RLock()

    def matches(self, layout: list[dict]) -> bool:
        return self.layout == layout

    def views(self) -> dict[str, torch.Tensor]:
        """name -> tensor view into the buckets (valid until the staging is written again)."""
        out = {}
        for buf, b in zip(self.buffers, self.layout):
            for name, off, n, shape in b["entries"]:
                out[name] = buf[off : off + n].view(shape)
        return out

    @torch.no_grad()
    def fill(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        for buf, b in zip(self.buffers, self.layout):
            for name, off, n, shape in b["entries"]:
                buf[off : off + n].copy_(tensors[name].detach().reshape(-1))
        self.version = version


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unit of weight sync: named parameters (tied weights once), as every loader expects them."""
    return {name: p.detach() for name, p in model.named_parameters()}
