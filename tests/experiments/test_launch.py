"""experiments/launch.py: a spawned run's host load is recorded for a run that finished or was stopped on
purpose, never for one that failed (its timing is not a run's)."""

import io
import subprocess
import sys

import pytest

from experiments.launch import Spawned
from relax.run_folder import HostLoad, RunFolder


@pytest.mark.parametrize("summary, rc, recorded", [({"steps": 3}, 0, True),
                                                    ({"steps": 2, "error": "stopped over the control API"}, 1, True),
                                                    (None, 1, False)])
def test_a_spawned_runs_host_load_is_kept_when_its_summary_is(tmp_path, summary, rc, recorded):
    folder = RunFolder.create(tmp_path, "async", "cpu", "r")
    if summary is not None:
        folder.write_summary(summary)
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({rc})"])
    spawned = Spawned(proc, ["relax", "run"], folder.path, io.StringIO(), HostLoad().__enter__())
    assert spawned.wait(timeout=60) == rc
    load = RunFolder(folder.path).host_load()
    assert (load is not None) == recorded
    if recorded:
        assert load["wall_s"] >= 0 and len(load["loadavg_before"]) == 3
