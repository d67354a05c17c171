"""The wandb sink: an offline W&B run in the run folder's wandb/ (no network; `wandb sync RUN/wandb/offline-run-*`
uploads it later, `wandb leet RUN/wandb` browses it in the terminal).

Every number of a step is logged at that step (per-role values as `busy_share/rollout`); events are counted
(`events/<kind>_total`, logged with the next step) and listed in the run's summary (`events`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from relax.metrics.sinks import scalars
from relax.run_folder import RunFolder


class WandbSink:
    def __init__(self, folder: RunFolder, project: str, group: str, config: dict):
        import wandb

        wdir = folder.sink_dir("wandb")
        # W&B makes `<dir>/wandb/` itself (the name run_folder.SINK_DIRS gives it) and, given a folder it cannot
        # write, quietly falls back to /tmp: make ours first (an error here drops the sink) and check below.
        assert wdir.name == "wandb", wdir
        wdir.mkdir(exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, save_code=False,
                                  disable_git=True, silent=True)
        self.run = wandb.init(project=project, group=group, name=folder.name, dir=str(wdir.parent), mode="offline",
                              config=config, settings=settings, reinit="create_new")
        if not Path(self.run.dir).resolve().is_relative_to(wdir.resolve()):
            self.run.finish()
            raise RuntimeError(f"W&B wrote its run to {self.run.dir}, not inside {wdir}")
        self.counts: Counter = Counter()
        self.events: list[dict] = []

    def step(self, step: int, metrics: Mapping) -> None:
        data = dict(scalars(metrics))
        data.update({f"events/{k}_total": n for k, n in self.counts.items()})
        self.run.log(data, step=step)

    def event(self, kind: str, payload: Mapping) -> None:
        self.counts[kind] += 1
        self.events.append({"event": kind, **payload})
        self.run.summary["events"] = self.events

    def close(self) -> None:
        self.run.summary.update({f"events/{k}_total": n for k, n in self.counts.items()})
        self.run.finish()


def make(cfg, folder: RunFolder) -> WandbSink:
    return WandbSink(folder, cfg.name, cfg.profile, cfg.model_dump(mode="json"))
