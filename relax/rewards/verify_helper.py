"""The process that runs math-verify for `relax.rewards.verify`: JSON `[gold, text]` lines in, one
`{"score": s}` or `{"error": msg}` line out per request. It is its own main thread, so math-verify's
signal-based timeouts work here; the parent's deadline covers what they cannot interrupt."""

from __future__ import annotations

import json
import logging
import sys

from relax.rewards.extract import answer_tag

_TIMEOUT_S = 5  # math-verify's limit per parse / comparison


def grade(gold: str, text: str) -> float:
    from math_verify import parse, verify

    reference = parse(gold, parsing_timeout=_TIMEOUT_S) or parse(f"${gold}$", parsing_timeout=_TIMEOUT_S)
    if not reference:
        raise ValueError(f"cannot parse the reference answer {gold!r}")
    # math-verify finds boxed and plain answers itself but cannot see inside reasoning-gym's tags.
    tagged = answer_tag(text)
    pred = parse(text if tagged is None else tagged, parsing_timeout=_TIMEOUT_S)
    return float(bool(pred) and verify(reference, pred, timeout_seconds=_TIMEOUT_S))


def main() -> None:
    out, sys.stdout = sys.stdout, sys.stderr  # stray prints must not corrupt the protocol
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeouts are answers (0.0), not news
    import math_verify  # noqa: F401  (pay the sympy import before saying ready)

    print("ready", file=out, flush=True)
    for line in sys.stdin:  # ends when the parent closes the pipe or dies
        try:
            reply = {"score": grade(*json.loads(line))}
        except ValueError as err:
            reply = {"error": str(err)}
        except Exception as err:
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), file=out, flush=True)


if __name__ == "__main__":
    main()
