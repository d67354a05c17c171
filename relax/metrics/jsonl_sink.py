"""The jsonl sink: the run folder's own files, live. Each step's row is appended to metrics.jsonl as the
controller sees it (the controller rewrites the file whole at the end, with every span counted in busy_s),
and each event to events.jsonl."""

from __future__ import annotations

from collections.abc import Mapping

from relax.run_folder import RunFolder


class JsonlSink:
    def __init__(self, folder: RunFolder):
        self.folder = folder

    def step(self, step: int, metrics: Mapping) -> None:
        self.folder.append_metrics({"step": step, **metrics})

    def event(self, kind: str, payload: Mapping) -> None:
        self.folder.append_event({"event": kind, **payload})

    def close(self) -> None:
        pass  # nothing held open: every line is written and closed at once


def make(cfg, folder: RunFolder) -> JsonlSink:
    return JsonlSink(folder)
