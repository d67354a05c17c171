"""Batch (rows handed out by the bus) and the conversion of row fields to and from TransferQueue's TensorDict.

Callers only ever see three kinds of field value, one entry per row:
  * a torch.Tensor [N, ...]        per-row scalars or fixed-shape values (lists of Python numbers become one)
  * list[torch.Tensor]             per-row tensors of varying leading length (token ids, log-probs, [T, k]
                                   expert indices); travels as a jagged nested tensor, comes back unbound
  * list[str]                      per-row strings; travels as a NonTensorStack
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Number
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, is_non_tensor

Value = torch.Tensor | list


@dataclass
class Batch:
    """Rows of one partition: `indexes` are TQ global indexes, `data[f]` holds one entry per row of field f."""

    step: int
    indexes: list[int]
    data: dict[str, Value] = field(default_factory=dict)
    # TQ custom metadata of each row (the sampler's order key). Bus.write must send it back: every TQ put
    # replaces the custom metadata of the rows it writes.
    row_meta: list[dict] = field(default_factory=list, repr=False)

    @property
    def size(self) -> int:
        return len(self.indexes)

    def __getitem__(self, name: str) -> Value:
        return self.data[name]

    def select(self, positions: list[int]) -> Batch:
        """The rows at `positions` (in that order), as a Batch that `Bus.write` still accepts."""
        data = {
            k: v[positions] if isinstance(v, torch.Tensor) else [v[p] for p in positions] for k, v in self.data.items()
        }
        return Batch(self.step, [self.indexes[p] for p in positions], data, [self.row_meta[p] for p in positions])

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        if len({b.step for b in batches}) != 1:
            raise ValueError("Batch.concat needs a non-empty list of batches of one partition")
        data = {}
        for k, v in batches[0].data.items():
            parts = [b.data[k] for b in batches]
            data[k] = torch.cat(parts) if isinstance(v, torch.Tensor) else [x for p in parts for x in p]
        indexes = [i for b in batches for i in b.indexes]
        return Batch(batches[0].step, indexes, data, [m for b in batches for m in b.row_meta])


def rows_length(fields: dict[str, Any]) -> int:
    """Number of rows in `fields`, checking every field has that many (errors name the field)."""
    if not fields:
        raise ValueError("no fields given")
    lengths = {}
    for name, value in fields.items():
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise ValueError(f"field '{name}': a 0-d tensor is not per-row data; give a 1-D tensor [N]")
            lengths[name] = value.shape[0]
        elif isinstance(value, (list, tuple)):
            lengths[name] = len(value)
        else:
            raise TypeError(
                f"field '{name}': expected a tensor [N, ...] or a list with one entry per row, "
                f"got {type(value).__name__}"
            )
    if len(set(lengths.values())) != 1:
        raise ValueError(f"fields have mismatched lengths (rows per field): {lengths}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise ValueError("no rows given")
    return n


def _column(name: str, value: Value) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    first = value[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(v, torch.Tensor) for v in value):
            raise TypeError(f"field '{name}': mixes tensors with other values")
        if first.dim() == 0:
            raise ValueError(f"field '{name}': per-row 0-d tensors; give per-row scalars as one 1-D tensor [N]")
        if any(v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in value):
            raise ValueError(
                f"field '{name}': per-row tensors must share dtype and all but the first dimension "
                f"(got {sorted({(str(v.dtype), tuple(v.shape[1:])) for v in value})})"
            )
        # From one concatenated buffer and its offsets: as_nested_tensor checks and copies row by row (3x slower).
        offsets = torch.zeros(len(value) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor([v.shape[0] for v in value]), 0, out=offsets[1:])
        return torch.nested.nested_tensor_from_jagged(torch.cat(value), offsets)
    if isinstance(first, str):
        if not all(isinstance(v, str) for v in value):
            raise TypeError(f"field '{name}': mixes strings with other values")
        return NonTensorStack(*value)
    if isinstance(first, Number):
        try:
            return torch.tensor(list(value))
        except (TypeError, ValueError) as err:
            raise TypeError(f"field '{name}': not a list of numbers ({err})") from None
    raise TypeError(
        f"field '{name}': unsupported row value {type(first).__name__}; use tensors, lists of tensors, numbers or str"
    )


def to_tensordict(fields: dict[str, Value]) -> TensorDict:
    n = rows_length(fields)
    return TensorDict({k: _column(k, v) for k, v in fields.items()}, batch_size=n)


def _rows(nt: torch.Tensor) -> list[torch.Tensor]:
    """A nested tensor's rows: views of its buffer when it is one contiguous jagged run (unbind is 2.5x slower)."""
    if nt.layout == torch.jagged and nt.lengths() is None and nt._ragged_idx == 1:
        return list(nt.values().split(nt.offsets().diff().tolist()))
    return list(nt.unbind())


def from_tensordict(td: TensorDict) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for k, v in td.items():
        if is_non_tensor(v):
            out[k] = list(v.tolist())
        elif v.is_nested:
            out[k] = _rows(v)
        else:
            out[k] = v
    return out
