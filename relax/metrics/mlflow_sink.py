"""The mlflow sink: an MLflow run in a local file store, the run folder's mlruns/
(`mlflow ui --backend-store-uri RUN/mlruns`; mlflow-skinny is enough to write and read it).

Experiment = the config's name, run = the run folder's name; the resolved config is the artifact config.yaml.
Every number of a step is a metric at that step (per-role values as `busy_share/rollout`, one batch per step);
an event is a JSON artifact `events/<n>-<kind>.json` and a running count `events/<kind>_total`.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from relax.metrics.sinks import scalars
from relax.run_folder import RunFolder


class MlflowSink:
    def __init__(self, store: Path, experiment: str, run_name: str, config_yaml: str):
        # MLflow 3 keeps the file store only behind this switch (it steers users to a database); a file store is
        # what needs no server and no SQLAlchemy here.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        store.mkdir(exist_ok=True)
        self.client = MlflowClient(tracking_uri=store.resolve().as_uri())
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        self.client.log_text(self.run_id, config_yaml, "config.yaml")
        self.last_step = 0
        self.counts: Counter = Counter()

    def step(self, step: int, metrics: Mapping) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars(metrics)])
        self.last_step = step

    def event(self, kind: str, payload: Mapping) -> None:
        self.counts[kind] += 1
        n = sum(self.counts.values())
        self.client.log_text(self.run_id, json.dumps(dict(payload), default=str), f"events/{n:04d}-{kind}.json")
        self.client.log_metric(self.run_id, f"events/{kind}_total", self.counts[kind], step=self.last_step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")


def make(cfg, folder: RunFolder) -> MlflowSink:
    from relax.config import dump_config

    return MlflowSink(folder.sink_dir("mlflow"), cfg.name, folder.name, dump_config(cfg))
