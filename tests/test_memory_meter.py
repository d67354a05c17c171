"""The driver's peak-memory meter samples on its own thread, off the schedule's loop, and counts child processes."""

import subprocess
import sys
import time

from relax.controller import MemoryMeter


def test_the_meter_samples_on_its_thread_and_counts_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(200 * 2**20); time.sleep(30)"])
    try:
        time.sleep(1.0)  # the child has its 200 MB
        meter = MemoryMeter(every_s=0.05)
        with meter:
            thread = meter._thread
            assert thread.is_alive() and thread.daemon
            time.sleep(0.3)
            during = meter.peak
        assert not thread.is_alive()
        assert during > 200 * 2**20  # the child's bytes, sampled while the caller slept
    finally:
        child.kill()
        child.wait()
