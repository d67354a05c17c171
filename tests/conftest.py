import os

import pytest

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


def _listeners(root) -> dict[tuple[str, int], str]:
    """Every listening TCP socket (and bound UDP socket) of `root` and its descendants: (ip, port) -> process."""
    import socket

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
                seen.update(_listeners(root))
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
