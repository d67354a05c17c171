"""What a streaming engine call generates: requests a feed hands it as slots free up.

`Feed(free) -> [(prompt ids, max_new_tokens), ...]`: at most `free` new requests, [] when it has none now.
Every engine's `generate_stream(feed, max_inflight, between)` asks its feed whenever it has a free slot (at most
`max_inflight` requests in flight), numbers the requests 0, 1, ... in the order the feed gave them, and yields
(number, Generation) as each one finishes. It returns once nothing is in flight and the feed gives nothing, so a
feed that refills keeps the engine full across the caller's claims (RolloutRole's feed) and `fixed` is one call
over a known list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

Request = tuple[list[int], int]
Feed = Callable[[int], list[Request]]


def limits(max_new_tokens: int | list[int], n: int) -> list[int]:
    """One max_new_tokens per request: a single limit for all `n`, or one each."""
    out = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(out) != n or min(out, default=1) < 1:
        raise ValueError(f"max_new_tokens: one limit >= 1 or one per prompt ({n}), got {max_new_tokens!r}")
    return out


def fixed(prompts: list[list[int]], max_new_tokens: int | list[int]) -> Feed:
    """A feed over a known list (request numbers are list positions)."""
    todo = deque(zip(prompts, limits(max_new_tokens, len(prompts))))

    def feed(free: int) -> list[Request]:
        return [todo.popleft() for _ in range(min(free, len(todo)))]

    return feed
