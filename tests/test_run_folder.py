"""The run-folder schema's idea of a finished run (relax/run_folder.py)."""

from relax.run_folder import RunFolder, find_runs, latest_runs, run_dirs


def test_a_stopped_run_is_not_a_finished_one(tmp_path):
    done = RunFolder.create(tmp_path, "async", "cpu", "a")
    done.write_summary({"steps": 3, "samples_lost": 0})
    stopped = RunFolder.create(tmp_path, "async", "cpu", "b")  # newer by name: the one latest_runs would take
    stopped.write_summary({"steps": 2, "error": "2 steps in a row were not finite"})
    running = RunFolder.create(tmp_path, "async", "cpu", "c")  # no summary yet
    assert done.complete and not done.stopped
    assert stopped.stopped and not stopped.complete
    assert not running.complete and not running.stopped
    assert run_dirs(tmp_path) == [done.path] == find_runs([tmp_path])
    assert latest_runs(tmp_path) == {("async", "cpu"): done.path}
    assert find_runs([stopped.path]) == [stopped.path]  # named directly, it is still read (relax report on it)
