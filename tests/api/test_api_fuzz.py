"""Schemathesis against a live run (issue 16): every operation of the control API, POST scale_out included, fuzzed
with valid and invalid input; no answer is a 5xx, every answer conforms to the schema, and the run, stopped over
the API once the fuzzing is done (POST /run/stop, the one operation not fuzzed: it ends the run), has lost and
repeated no sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

EXAMPLES = 6  # per operation and generation mode: ~100 requests in all, a minute with a replica started
STOP = "POST /run/stop"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before writing {path.name}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {path.name}")
        time.sleep(0.1)


def test_fuzzing_every_operation_of_a_live_run_gets_no_5xx_and_loses_no_sample(tmp_path):
    steps = 1000  # more than the fuzzing needs on any machine: the test stops the run itself
    cmd = [sys.executable, "-m", "relax.cli", "run", str(ROOT / "experiments/async/cpu.yaml"), "--no-progress",
           "--out", str(tmp_path), "--run", "fuzz", "--api-port", "0", f"steps={steps}",
           "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.chunk_groups=1", "warmup.steps=20",
           "task.eval_size=8", "health.heartbeat_timeout_s=600", "rollout.max_replicas=2"]
    env = {**os.environ, "RELAX_CACHE": os.environ.get("RELAX_CACHE", "/tmp/relax-cache")}
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    run_dir = tmp_path / "async" / "cpu" / "fuzz"
    calls: dict[str, list[int]] = {}
    try:
        _wait_for(run_dir / "api.json", proc, 400)
        url = json.loads((run_dir / "api.json").read_text())["url"]
        auth = {"Authorization": f"Bearer {(run_dir / 'api_token').read_text().strip()}"}
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth, timeout=30)
        operations = [result.ok() for result in schema.get_all_operations()]
        labels = {op.label for op in operations}
        assert "POST /rollout/scale_out" in labels and "POST /rollout/scale_in" in labels, labels
        assert STOP in labels, labels
        operations = [op for op in operations if op.label != STOP]

        for op in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
                @given(case=op.as_strategy(generation_mode=mode))
                def fuzz(case):
                    assert proc.poll() is None, "the run ended while being fuzzed"
                    response = case.call(base_url=url, headers=auth, timeout=60)
                    calls.setdefault(op.label, []).append(response.status_code)
                    case.validate_response(response, checks=CHECKS, headers=auth)

                try:
                    fuzz()
                except Unsatisfiable:  # nothing to make invalid (an operation with no parameters or body)
                    assert mode == GenerationMode.NEGATIVE and not list(op.path_parameters) and len(op.body) == 0
        assert proc.poll() is None, "the run finished before the fuzzing did: raise `steps`"
        assert set(calls) == labels - {STOP}  # every other operation was called
        stop = httpx.post(f"{url}/run/stop", headers=auth, timeout=30)
        assert stop.status_code == 200 and stop.json()["status"] == "stopping", stop.text
        rc = proc.wait(timeout=600)
        assert rc == 1, (tmp_path / "run.log").read_text()[-4000:]  # stopped early: not a finished run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_planned"] == steps and 1 <= summary["steps"] < steps
    assert "stopped over the control API" in summary["error"]
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0
    print({k: sorted(set(v)) for k, v in calls.items()})  # which answers the fuzzing got, per operation
