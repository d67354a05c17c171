"""Processes the engine starts outside Ray (engine servers, their watchdogs, SGLang): a free port to give them,
and the one way to stop them, by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now ('' checks every interface, for a port other nodes dial)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def terminate(proc: subprocess.Popen, timeout: float = 10.0, group: bool = False) -> int | None:
    """SIGTERM `proc` (its whole process group with `group`), SIGKILL after `timeout`; returns its exit code."""
    kill = os.killpg if group else os.kill
    if proc.poll() is None:
        kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
