"""Tools an agent calls from its own output: a safe calculator and a sandboxed Python evaluator.

A tool call is written by the model as `<tool>NAME: ARGUMENT</tool>`. `ToolBox.call` never raises: a tool
that raises, hangs, blows its memory limit or returns garbage comes back as an error observation string
(`error: ...`), so one bad call costs a turn, never the run.
"""

from __future__ import annotations

import ast
import math
import operator
import os
import re
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

TOOL_RE = re.compile(r"<tool>\s*([A-Za-z_][A-Za-z0-9_]*)\s*:(.*?)</tool>", re.S)
TOOL_END = "</tool>"
MAX_OBS_CHARS = 200  # a tool's reply is cut to this many characters (a runaway print cannot flood the context)


@dataclass(frozen=True)
class ToolCall:
    name: str
    argument: str
    end: int  # index in the text just past `</tool>`


def parse_tool_call(text: str) -> ToolCall | None:
    """The first well-formed tool call in `text`, or None."""
    m = TOOL_RE.search(text)
    if m is None:
        return None
    return ToolCall(m.group(1), m.group(2).strip(), m.end())


# ---- calculator: arithmetic over an AST whitelist -----------------------------------------------------
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"abs": abs, "min": min, "max": max, "round": round, "sqrt": math.sqrt}
MAX_POW = 64
MAX_EXPR = 200


def calculate(expr: str):
    """Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, abs/min/max/round/sqrt.
    Anything else (names, attributes, calls to other functions, huge powers) raises ValueError."""
    if len(expr) > MAX_EXPR:
        raise ValueError(f"expression longer than {MAX_EXPR} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an expression: {err.msg}") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > MAX_POW or abs(a) > 1e6):
                raise ValueError("power too large")
            return _BIN[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UN:
            return _UN[type(node.op)](ev(node.operand))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords):
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise ValueError(f"unsupported syntax: {type(node).__name__}")

    value = ev(tree)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


# ---- sandboxed Python ---------------------------------------------------------------------------------
def _limits(memory_bytes: int, cpu_s: int):
    def apply():  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        # Soft limit SIGXCPU one second past the wall-clock timeout (which normally fires first), hard SIGKILL after.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        os.setsid()  # its own process group: a timeout kills everything it started
    return apply


def run_python(code: str, timeout_s: float = 2.0, memory_mb: int = 256) -> str:
    """Run `code` in a fresh isolated interpreter (`python -I -S`, empty env, temp cwd) under a wall-clock
    timeout and address-space / CPU / file limits; returns its stdout. Raises RuntimeError on failure."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="relax-sbx") as cwd:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-S", "-c", code], capture_output=True, timeout=timeout_s, cwd=cwd,
                env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                preexec_fn=_limits(memory_mb << 20, math.ceil(timeout_s) + 1),
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        if -proc.returncode in (signal.SIGXCPU, signal.SIGKILL):  # the CPU limit beat the wall clock
            raise RuntimeError(f"timed out: CPU limit of {math.ceil(timeout_s) + 1} s reached")
        raise RuntimeError(tail[0] if proc.returncode > 0 else f"killed by signal {-proc.returncode}")
    return proc.stdout.decode("utf-8", "replace")


def clean(text, limit: int = MAX_OBS_CHARS) -> str:
    """A tool's reply as safe observation text: a str, printable ASCII only, bounded length."""
    if not isinstance(text, str):
        text = repr(text)
    text = "".join(c if 32 <= ord(c) < 127 else " " for c in text).strip()
    return text[:limit]


class ToolBox:
    """Named tools; `call` turns every failure into `error: ...` text."""

    def __init__(self, tools: dict[str, Callable[[str], object]] | None = None):
        self.tools = dict(tools) if tools is not None else {"calc": calculate, "python": run_python}

    def call(self, name: str, argument: str) -> tuple[str, bool]:
        """(observation text, ok)."""
        fn = self.tools.get(name)
        if fn is None:
            return clean(f"error: unknown tool '{name}' (have: {', '.join(sorted(self.tools))})"), False
        try:
            out = fn(argument)
        except BaseException as err:  # noqa: BLE001 - a tool must never end the run (SystemExit, recursion...)
            if isinstance(err, KeyboardInterrupt):
                raise
            return clean(f"error: {type(err).__name__}: {err}"), False
        try:
            return clean(out), True
        except Exception as err:  # noqa: BLE001 - a result whose repr itself fails
            return clean(f"error: unprintable result ({type(err).__name__})"), False
