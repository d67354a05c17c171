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


def test_pss_is_read_again_only_when_a_resident_set_grows_or_the_period_passes():
    """Reading PSS costs ~5 ms a process: the meter reads resident sets each tick and PSS only when their sum grew
    by over 1% past the last PSS read's (a child allocating 100 MB is caught at once), or every
    pss_every_s."""
    grow = ("import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\nb = bytearray(100 * 2**20)\nprint('grown', flush=True)\n"
            "time.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"  # its interpreter is up: nothing grows until told
        meter = MemoryMeter(every_s=3600, pss_every_s=3600)
        meter.sample()
        first, reads = meter.peak, meter.pss_reads
        for _ in range(3):
            meter.sample()  # nothing grew: no PSS read
        assert meter.pss_reads == reads == 1
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "grown"
        meter.sample()
        assert meter.pss_reads == 2 and meter.peak > first + 90 * 2**20
        periodic = MemoryMeter(every_s=3600, pss_every_s=0.0)
        periodic.sample()
        periodic.sample()
        assert periodic.pss_reads == 2
    finally:
        child.kill()
        child.wait()
