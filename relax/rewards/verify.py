"""The math-verify rule: symbolic equivalence of the response's final answer and the reference.

Grading runs in a helper process (`relax.rewards.verify_helper`), started on first use. math-verify bounds
its own work with signal.alarm, which fails outside the main thread (roles may grade from Ray worker
threads) and cannot interrupt C-level arithmetic anyway: `\\boxed{10^{10^{10^{10}}}}` runs for minutes.
A grade that overruns its deadline kills the helper and is flagged; the next grade starts a fresh one.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relax.tasks.prompt import Prompt

DEADLINE_S = 20.0  # per grade: math-verify's three 5 s steps, plus slack for a loaded machine
START_TIMEOUT_S = 120.0  # importing sympy on a busy 2-core machine


class _Helper:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # one request on the pipe at a time
        self._proc: subprocess.Popen | None = None

    def _read(self, timeout: float) -> str:
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            self._stop()
            raise TimeoutError(f"math_verify took over {timeout:.0f}s")
        line = self._proc.stdout.readline()
        if not line:
            self._stop()
            raise RuntimeError("math_verify helper died")
        return line

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):  # a write that found it dead may still be buffered
                    pipe.close()
            self._proc = None

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # so the helper imports this checkout of relax
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "relax.rewards.verify_helper"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        self._read(START_TIMEOUT_S)  # its "ready" line

    def grade(self, gold: str, text: str) -> float:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            try:
                self._proc.stdin.write(json.dumps([gold, text]) + "\n")
                self._proc.stdin.flush()
            except BrokenPipeError:
                self._stop()
                raise RuntimeError("math_verify helper died") from None
            reply = json.loads(self._read(DEADLINE_S))
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["score"]


_helper = _Helper()
atexit.register(_helper._stop)


def math_verify(response_text: str, prompt: Prompt) -> float:
    return _helper.grade(prompt.answer, response_text)
