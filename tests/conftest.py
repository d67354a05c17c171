import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Never touch the network, and keep caches (warm-up weights, converted models) inside the test session.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _relax_cache(tmp_path_factory):
    # Warm-up caches are keyed by config hash, so sharing the user's cache is safe and saves minutes;
    # RELAX_TEST_CACHE isolates a CI run completely when set.
    if os.environ.get("RELAX_TEST_CACHE"):
        os.environ["RELAX_CACHE"] = os.environ["RELAX_TEST_CACHE"]
    yield


@pytest.fixture
def local_ray():
    """A private local Ray instance for one test (its own temp dir), always shut down."""
    from relax.cluster import RaySession

    with RaySession(num_cpus=4) as session:
        yield session


@pytest.fixture
def watch_listeners():
    """`seen = watch_listeners(pid)` samples, every 0.5 s until the test ends, every socket that process tree
    (default: this test's own process, with the Ray session it starts) listens on; `seen` fills as it goes:
    (ip, port) -> "pid name"."""
    import threading

    import psutil

    stop, threads = threading.Event(), []

    def start(pid: int | None = None) -> dict:
        root, seen = psutil.Process(pid), {}

        def loop():
            while True:
                seen.update(listeners(root))
                if stop.wait(0.5):
                    return

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()
        return seen

    yield start
    stop.set()
    for t in threads:
        t.join(10)


@pytest.fixture
def tmp_results(tmp_path):
    return tmp_path / "results"


CHROMIUM = "/usr/bin/chromium"  # Debian's package (`make browser` installs it)


@pytest.fixture
def chromium(tmp_path):
    """Headless Debian chromium: `chromium(url, dump_dom=True)` returns the DOM after the page's scripts ran for
    `budget_ms` of virtual time; `chromium(url, screenshot=path)` writes a PNG. Skips where it is not installed."""
    import shutil
    import subprocess

    if not (shutil.which(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no {CHROMIUM} (Debian chromium; `make browser` installs it)")
    profile = tmp_path / "chromium-profile"

    def run(url: str, dump_dom: bool = False, screenshot=None, budget_ms: int = 3000, size: str = "1280,900") -> str:
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", f"--window-size={size}"]
        args += ["--dump-dom"] if dump_dom else [f"--screenshot={screenshot}"]
        out = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    return run


# ---- live runs shared by tests in several folders (each test asserts its own properties on the one run) ----------
# The small-run overrides of the end-to-end tests (tests/test_e2e.py): a tiny Qwen3, 4 prompts x 4 samples a step.
SMALL = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=2", "warmup.steps=40",
         "task.eval_size=16", "model.hidden_size=64", "model.intermediate_size=128"]


def _relax_run(out: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "relax.cli", "run", *args, "--out", str(out), "--no-progress"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def async_cli_run(tmp_path_factory):
    """The README's worked example, the documented command with the `capped_pg` policy loss: `relax run
    experiments/async/cpu.yaml --steps 4 --out DIR algorithm.policy_loss=capped_pg` (small). Read by
    tests/test_e2e.py (the CLI run) and tests/roles/test_roles_algorithms_e2e.py (the loss runs end to end)."""
    out = tmp_path_factory.mktemp("async_cli") / "results"
    proc = _relax_run(out, "experiments/async/cpu.yaml", "--steps", "4", *SMALL, "algorithm.policy_loss=capped_pg")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = list((out / "async" / "cpu").iterdir())
    return run_dir


def listeners(root) -> dict[tuple[str, int], str]:
    """Every listening TCP socket (and bound UDP socket) of psutil process `root` and its descendants:
    (ip, port) -> process."""
    import psutil

    out = {}
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            for c in p.net_connections("inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                    out[(c.laddr.ip, c.laddr.port)] = f"{p.pid} {p.name()}"
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _engine_server(root):
    """(psutil process, weight version) of the run's torch engine server (a descendant of `root`), or None while it
    is not up."""
    import psutil

    from relax.engines.sglang import EngineClient

    for p in root.children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "relax.engines.http_server" not in cmd:
            continue
        client = EngineClient(f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}", timeout=5)
        try:
            return p, int(client.weight_version())
        except Exception:  # noqa: BLE001 - not up yet
            pass
        finally:
            client.close()
    return None


@pytest.fixture(scope="session")
def torch_http_run(tmp_path_factory):
    """One `relax run` of the torch engine HTTP server (rollout.engine=torch_http) with the control API on, read by
    tests/test_e2e.py (the CLI run; the Actor's versions reach the server), tests/test_cluster_network.py (every
    socket listens on loopback) and tests/engines/test_remote_engine.py (a SIGKILLed server restarts its replica).

    While it trains, this samples every listening socket of the run's process tree, and SIGKILLs the engine server
    while it holds a version in `window`. With max_staleness 1 partition k is generated with weights >= k - 1,
    so a server at version v <= steps - 3 has not yet been asked for the last partition: the Rollout must find it
    dead. A kill at a later version could land after the Rollout's last request, and nothing would notice it (CI
    failed that way once: recovery.json had no event). The window is every version from 1, so a poll that lags
    (a loaded machine, the server busy generating) still has three steps to land in it."""
    import psutil

    tmp = tmp_path_factory.mktemp("torch_http")
    out = tmp / "results"
    steps = 6
    cmd = [sys.executable, "-m", "relax.cli", "run", "experiments/async/cpu.yaml", "--steps", str(steps), "--out",
           str(out), "--run", "net", "--no-progress", "--api-port", "0", "rollout.engine=torch_http", *SMALL]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # ignored: a local run keeps token auth on
    log_path = tmp / "run.log"
    seen: dict[tuple[str, int], str] = {}
    killed, versions = None, []
    window = range(1, steps - 2)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 900
        last_scan = 0.0
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None and time.time() < deadline:
                if time.time() - last_scan > 1.0:  # the socket scan is slow (every process's table): not each poll
                    seen.update(listeners(root))
                    last_scan = time.time()
                server = _engine_server(root) if killed is None else None
                if server is not None:
                    versions.append(server[1])
                    if server[1] in window:
                        server[0].kill()
                        killed = SimpleNamespace(pid=server[0].pid, version=server[1])
                time.sleep(0.1)
            seen.update(listeners(root))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return SimpleNamespace(returncode=proc.returncode, log=log_path.read_text(), run_dir=out / "async" / "cpu" / "net",
                           seen=seen, killed=killed, versions=sorted(set(versions)), steps=steps)
