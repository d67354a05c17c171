"""The control API's `/metrics` page: a run's state as Prometheus metrics, through prometheus_client.

One `CollectorRegistry` per app (never the process-wide one: a test makes several apps), holding one collector
that reads the run when scraped (the supervisor's `metrics()` and the rollout pool), so nothing is copied into
gauges between scrapes. `EXPORTED` is the list of every name it can export; the Grafana dashboard shipped
beside this module (grafana/relax.json) queries only these (tests/api checks it against a live page).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

DASHBOARD = Path(__file__).with_name("grafana") / "relax.json"

# key of the supervisor's metrics() -> (name, type, help, label of a per-role dict or None). A counter's
# samples are exposed as `<name>_total`.
METRICS: dict[str, tuple[str, str, str, str | None]] = {
    "steps_done": ("relax_steps_done", "gauge", "training steps finished", None),
    "steps_planned": ("relax_steps_planned", "gauge", "training steps the run will take (config steps)", None),
    "weights_version": ("relax_weights_version", "gauge", "newest weight version the Actor published", None),
    "role_weights_version": ("relax_role_weights_version", "gauge",
                             "newest weight version each live DCS member holds", "role"),
    "weight_transfers": ("relax_weight_transfers", "counter", "DCS weight transfers completed", None),
    "weight_transfer_bytes": ("relax_weight_transfer_bytes", "counter", "bytes moved by DCS weight transfers", None),
    "role_restarts": ("relax_role_restarts", "counter", "Tier 1 in-place restarts per role (rollout-<i>: a replica)",
                      "role"),
    "global_restarts": ("relax_global_restarts", "counter", "Tier 2 global restarts", None),
    "role_busy_share": ("relax_role_busy_share", "gauge",
                        "share of the last step's time each role spent working (spans received so far)", "role"),
    "staleness_mean": ("relax_staleness_mean", "gauge", "mean staleness (steps) of the last step's samples", None),
    "staleness_max": ("relax_staleness_max", "gauge", "largest staleness of the last step's samples", None),
    "reward_mean": ("relax_reward_mean", "gauge", "mean reward of the last step", None),
    "loss": ("relax_loss", "gauge", "policy loss of the last step", None),
    "step_time_seconds": ("relax_step_time_seconds", "gauge", "wall time of the last step", None),
    "trainer_wait_seconds": ("relax_trainer_wait_seconds", "gauge",
                             "seconds the Actor waited for data in the last step", None),
    "weight_sync_seconds": ("relax_weight_sync_seconds", "gauge", "seconds the last step's weight publish took",
                            None),
    "bus_rows_held": ("relax_bus_rows_held", "gauge", "rows on the TransferQueue bus (all partitions)", None),
    "bus_partitions_held": ("relax_bus_partitions_held", "gauge", "partitions on the bus not yet freed", None),
    "bus_queue_depth": ("relax_bus_queue_depth", "gauge",
                        "rows on the bus each role could fetch now and has not yet (its input queue)", "role"),
    "samples_trained": ("relax_samples_trained", "counter", "samples in committed weight versions (DCS ledger)",
                        None),
    "samples_lost": ("relax_samples_lost", "gauge", "samples of committed steps missing from the ledger", None),
    "samples_duplicated": ("relax_samples_duplicated", "gauge", "samples the ledger holds more than once", None),
    "rollout_replicas": ("relax_rollout_replicas", "gauge", "rollout replicas in the pool", None),
    "rollout_replicas_healthy": ("relax_rollout_replicas_healthy", "gauge", "rollout replicas answering health",
                                 None),
    "scale_operations": ("relax_scale_operations", "gauge", "stored scale operations by kind and status",
                         "kind,status"),
}
EXPORTED = sorted(name + ("_total" if kind == "counter" else "") for name, kind, _, _ in METRICS.values())


def dashboard_metric_names(path: Path = DASHBOARD) -> set[str]:
    """Every relax_* name a Grafana dashboard queries (its panels' exprs and its query variables)."""
    dash = json.loads(Path(path).read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dash.get("templating", {}).get("list", []) if v.get("type") == "query"]
    return {n for e in exprs for n in re.findall(r"\brelax_[a-z_]+\b", e)}


def exported_names(text: str) -> set[str]:
    """The metric names a /metrics page declares (its `# TYPE` lines; a counter's carry `_total`)."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


class RunCollector:
    """Reads `metrics()` (keys of METRICS; a per-role key maps a label value to a number) when scraped."""

    def __init__(self, metrics: Callable[[], dict]):
        self.metrics = metrics

    def collect(self):
        values = self.metrics()
        for key, (name, kind, doc, label) in METRICS.items():
            value = values.get(key)
            if value is None:  # not known yet (no step finished, no API pool): left out, not a made-up 0
                continue
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=label.split(",") if label else None)
            if label is None:
                family.add_metric([], float(value))
            else:
                for lab, v in sorted(value.items()):
                    family.add_metric(list(lab) if isinstance(lab, tuple) else [str(lab)], float(v))
            yield family


def registry_for(metrics: Callable[[], dict]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(metrics))
    return registry


def exposition(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The page and its content type, negotiated from the scraper's Accept header (Prometheus text 0.0.4 by
    default, OpenMetrics when asked)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
