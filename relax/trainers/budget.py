"""How our trainers cut and pad rows, without torch: what the cost model (relax.sim) prices is what they compute.

Both trainers and the log-prob forwards right-pad a slice of rows to its longest row (relax.trainers.batching.pack),
so a slice of n rows computes n x longest tokens, whatever the rows' own lengths.
"""

from __future__ import annotations


def budget_slices(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) slices whose padded size (rows x longest row) stays within `budget` tokens."""
    out, lo, longest = [], 0, 0
    for i, n in enumerate(lengths):
        longest_next = max(longest, n)
        if i > lo and longest_next * (i - lo + 1) > budget:
            out.append((lo, i))
            lo, longest_next = i, n
        longest = longest_next
    if lo < len(lengths):
        out.append((lo, len(lengths)))
    return out


def padded_work(lengths: list[float], budget: float | None = None) -> tuple[float, float]:
    """(tokens, sum of squared lengths) a forward computes over rows of these sequence lengths, in order: cut by
    `budget_slices` (None: one slice, as a training micro-batch is), each slice padded to its longest row."""
    tokens = sumsq = 0.0
    slices = budget_slices(lengths, budget) if budget is not None else [(0, len(lengths))]
    for lo, hi in slices:
        if hi == lo:
            continue
        longest = max(lengths[lo:hi])
        tokens += (hi - lo) * longest
        sumsq += (hi - lo) * longest * longest
    return tokens, sumsq
