"""relax/metrics/processes.py: the run's CPU by process."""

import os
import subprocess
import sys
import time

import psutil

from relax.metrics import processes


def test_a_child_that_spins_is_named_and_counted_and_the_driver_is_the_root():
    """A child process (a plain script: named by its executable) is counted with the CPU it burnt between the
    snapshots, from zero since it started after the first; the root is "driver"."""
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)\n"
    start = processes.snapshot()
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        proc = psutil.Process(child.pid)
        deadline = time.time() + 30
        while proc.cpu_times().user + proc.cpu_times().system < 0.4 and time.time() < deadline:
            time.sleep(0.05)
        end = processes.snapshot()
        names = {name for name, _ in end.values()}
        assert "driver" in names
        got = processes.cpu_by_process(start, end, steps=2)
        child_label = processes.label(proc, psutil.Process().pid)
        assert child_label == os.path.basename(sys.executable)
        assert got[child_label] >= 0.4 / 2 - 0.02  # per step, from zero: it started after the first snapshot
    finally:
        child.kill()
        child.wait()


def test_ray_titles_name_the_actor_class_not_its_method():
    class Fake:
        pid = 2

        def cmdline(self):
            return ["ray::DCSCoordinator.heartbeat"]

        def name(self):
            return "python"

    class Daemon(Fake):
        def cmdline(self):
            return ["/venv/bin/python", "-u", "/venv/lib/ray/_private/log_monitor.py", "--session-dir=x"]

    assert processes.label(Fake(), driver_pid=1) == "ray::DCSCoordinator"
    assert processes.label(Daemon(), driver_pid=1) == "log_monitor.py"
    assert processes.label(Fake(), driver_pid=2) == "driver"
