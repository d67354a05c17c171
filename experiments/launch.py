"""The one way a study launches a run: `run` in this process, or `spawn` as a `relax run` process.

`run` is the default (the run's summary comes back as it ends). `spawn` is for a study that needs a run beside
something else: two runs side by side under the same load (R3 off / on), or a live run driven over its control
API (elastic scaling). Both take the same spec (config file, overrides, results root, run name, steps) and both
time the run with `relax.run_folder.HostLoad` into the run folder's host_load.json, so every timed run says
what else used the cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from relax.run_folder import HostLoad, RunFolder

ROOT = Path(__file__).resolve().parents[1]


def run_dir(config: str | Path, overrides: list[str], out: Path, run: str) -> Path:
    """Where the run of (config, overrides) named `run` writes under `out`."""
    from relax.config import load_config

    cfg = load_config(config, list(overrides))
    return Path(out) / cfg.name / cfg.profile / run


def run(config: str | Path, overrides: list[str] = (), out: Path = ROOT / "results", run: str | None = None,
        steps: int | None = None, progress: bool = False) -> tuple[Path, dict]:
    """`relax run CONFIG OVERRIDES [--steps N]` in this process; (run folder, summary)."""
    from relax.config import load_config
    from relax.controller import run_experiment

    cfg = load_config(config, [*overrides, *([f"steps={steps}"] if steps else [])])
    with HostLoad() as load:
        folder, summary = run_experiment(cfg, out=out, run=run, progress=progress)
    RunFolder(folder).write_host_load(load.record)
    return Path(folder), summary


class Spawned:
    """A `relax run` process started by `spawn`; `wait()` returns its exit code and records its host load."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], folder: Path, log, load: HostLoad):
        self.proc, self.cmd, self.run_dir, self._log, self._load = proc, cmd, folder, log, load

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._finish(rc)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._finish(self.proc.returncode)

    def _finish(self, rc: int) -> None:
        if self._log.closed:
            return
        self._log.close()
        self._load.__exit__(None, None, None)
        folder = RunFolder(self.run_dir)
        # a run stopped on purpose (POST /run/stop: rc 1, its summary kept) was timed as much as a finished one
        if (rc == 0 and folder.complete) or folder.stopped:
            folder.write_host_load(self._load.record)


def spawn(config: str | Path, overrides: list[str] = (), out: Path = ROOT / "results", run: str = "run",
          steps: int | None = None, log: Path | None = None, api_port: int | None = None,
          cwd: Path | None = None) -> Spawned:
    """`python -m relax.cli run CONFIG OVERRIDES --out OUT --run RUN --no-progress` as a child process in `cwd`
    (default: this one; this checkout first on its PYTHONPATH), its console to `log`. CONFIG and OUT are as that process sees them."""
    cmd = [sys.executable, "-m", "relax.cli", "run", str(config), *overrides, "--out", str(out), "--run", run,
           "--no-progress", *(["--steps", str(steps)] if steps else []),
           *(["--api-port", str(api_port)] if api_port is not None else [])]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    log_file = open(log or os.devnull, "w")
    load = HostLoad().__enter__()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    folder = run_dir(Path(cwd or ".") / config, overrides, Path(cwd or ".") / out, run)
    return Spawned(proc, cmd, folder, log_file, load)

