"""A run's status in one small dict: what `relax status RUN_DIR`, the control API's `/status` and its `/view`
page show.

While the run goes on, the controller writes it to `status.json` (relax/run_folder.py) from its poll, at most
once a second (`Controller.write_status`); metrics.jsonl does not exist yet. After the run, `read_status` builds the same
dict from summary.json, metrics.jsonl and recovery.json (runs from before status.json existed too).

Schema (every number finite or null, so a browser's JSON.parse reads it):
  run, experiment, profile, mode, state (starting | running | finished | stopped | failed), error, updated_at,
  elapsed_s, steps_done, steps_total, reward [[step, reward_mean], ...], last {step's metrics},
  busy_share {role: share of the run's wall time inside that role's spans}, recoveries [...], faults [...],
  scale_operations [...], alerts {active [...], history [...], delivery_errors {...}}
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from relax.run_folder import RunFolder

RECENT = 20  # recoveries / faults / scale operations / alert changes kept in the status
STALE_S = 30  # a live status older than this is shown as possibly dead (the controller polls ~3 times a second)
LAST_FIELDS = ("reward_mean", "loss", "grad_norm", "tokens", "step_time_s", "staleness_max", "trainer_wait_s",
               "weight_sync_s")


def finite(x):
    """The value with every NaN / inf float replaced by None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def recovery_view(ev: dict) -> dict:
    return {k: ev.get(k) for k in ("role", "replica", "tier", "reason", "kind", "t_detect", "ready_s",
                                   "resume_step", "steps_done_at_detect")}


def scale_view(op: dict) -> dict:
    return {k: op.get(k) for k in ("request_id", "kind", "status", "num_replicas", "engine_ids", "created_at")}


def last_view(row: dict) -> dict:
    return {k: row[k] for k in ("step", *LAST_FIELDS) if k in row}


def make_status(folder: RunFolder, cfg_view: dict, state: str, steps_done: int, rows: list[dict],
                elapsed_s: float | None, busy_share: dict, events: list[dict], faults: list[dict],
                scale_operations: list[dict], alerts: dict | None, error: str | None = None,
                updated_at: float | None = None) -> dict:
    return finite({
        "run": folder.name, "experiment": cfg_view.get("name", folder.experiment), "profile": folder.profile,
        "mode": cfg_view.get("mode"), "state": state, "error": error,
        "updated_at": time.time() if updated_at is None else updated_at,
        "elapsed_s": None if elapsed_s is None else round(elapsed_s, 2),
        "steps_done": steps_done, "steps_total": cfg_view.get("steps"),
        "reward": [[r["step"], r.get("reward_mean")] for r in rows],
        "last": last_view(rows[-1]) if rows else {},
        "busy_share": {k: round(v, 4) for k, v in busy_share.items()},
        "recoveries": [recovery_view(e) for e in events][-RECENT:],
        "faults": [{k: f.get(k) for k in ("role", "replica", "kind", "at_step", "steps_done")} for f in faults][-RECENT:],
        "scale_operations": [scale_view(op) for op in scale_operations][-RECENT:],
        "alerts": alerts or {"active": [], "history": [], "delivery_errors": {}},
    })


def read_status(run_dir: str | Path) -> dict:
    """The run's status: rebuilt from its result files once it finished, else the live status.json."""
    folder = RunFolder(run_dir)
    live = folder.status()
    if not folder.complete:
        if live is None:
            raise FileNotFoundError(f"{folder.path}: no {'status.json'} nor summary.json (not a run folder, or a "
                                    "run that has not started yet)")
        return live
    summary, rows, rec = folder.summary(), folder.metrics(), folder.recovery() or {}
    cfg = folder.config()
    train_s = summary.get("train_time_s")
    return make_status(folder, {"name": summary.get("experiment") or cfg.get("name"),
                                "mode": summary.get("mode") or cfg.get("mode"),
                                "steps": cfg.get("steps", summary.get("steps"))},
                       "finished" if live is None else live.get("state", "finished"), summary.get("steps", len(rows)),
                       rows, train_s, summary.get("busy_share", {}), rec.get("events", []), rec.get("faults", []),
                       rec.get("scale_operations", []), (live or {}).get("alerts"), (live or {}).get("error"),
                       updated_at=(folder / "summary.json").stat().st_mtime)


def view_url(run_dir: str | Path) -> str | None:
    """The live view's address with the token in its fragment, while the run's API is up (else None)."""
    import json

    run_dir = Path(run_dir)
    try:
        url = json.loads((run_dir / "api.json").read_text())["url"]
        token = (run_dir / "api_token").read_text().strip()
    except (OSError, ValueError, KeyError):
        return None
    return f"{url}/view#token={token}"


def render(status: dict):
    """The status as rich renderables (a summary table, then recoveries, scale operations and alerts)."""
    from rich.console import Group
    from rich.table import Table

    s = status
    head = Table(title=f"{s['experiment']}/{s['profile']}/{s['run']}", show_header=False)
    head.add_column("field", style="bold")
    head.add_column("value")
    done, total = s.get("steps_done", 0), s.get("steps_total")
    state = s["state"] + (f" ({s['error']})" if s.get("error") else "")
    age = time.time() - (s.get("updated_at") or 0)
    if s["state"] == "running" and age > STALE_S:  # the controller rewrites it every second while steps run
        state += f" (no update for {age:.0f} s: the driver may have died)"
    head.add_row("state", state)
    head.add_row("mode", str(s.get("mode")))
    head.add_row("progress", f"{done} / {total} steps" + (f" ({100 * done / total:.0f}%)" if total else ""))
    if s.get("elapsed_s") is not None:
        head.add_row("elapsed", f"{s['elapsed_s']:.1f} s")
    rewards = [r for _, r in s.get("reward", []) if r is not None]
    if rewards:
        head.add_row("reward", f"first {rewards[0]:.4f}  last {rewards[-1]:.4f}  best {max(rewards):.4f}  "
                     f"{sparkline(rewards)}")
    for k, v in s.get("last", {}).items():
        if k != "step" and v is not None:
            head.add_row(f"last step: {k}", f"{v:.4g}" if isinstance(v, float) else str(v))
    parts = [head]
    if s.get("busy_share"):
        t = Table(title="utilisation (share of wall time busy)")
        t.add_column("role")
        t.add_column("busy", justify="right")
        t.add_column("")
        for role, share in s["busy_share"].items():
            t.add_row(role, f"{100 * share:.1f}%", "█" * round(20 * min(share, 1.0)))
        parts.append(t)
    if s.get("recoveries"):
        t = Table(title="recoveries")
        for c in ("role", "tier", "reason", "detected at s", "ready after s"):
            t.add_column(c)
        for e in s["recoveries"]:
            role = e["role"] + (f"-{e['replica']}" if e.get("replica") is not None else "")
            t.add_row(role, str(e.get("tier") or e.get("kind") or ""), str(e.get("reason") or e.get("kind") or ""),
                      _f(e.get("t_detect")), _f(e.get("ready_s")))
        parts.append(t)
    if s.get("scale_operations"):
        t = Table(title="scale operations")
        for c in ("kind", "status", "replicas", "engines"):
            t.add_column(c)
        for op in s["scale_operations"]:
            t.add_row(str(op.get("kind")), str(op.get("status")), str(op.get("num_replicas")),
                      ", ".join(op.get("engine_ids") or []))
        parts.append(t)
    alerts = s.get("alerts") or {}
    if alerts.get("history"):
        t = Table(title=f"alerts ({len(alerts.get('active', []))} firing)")
        for c in ("rule", "state", "after step", "message"):
            t.add_column(c)
        for a in alerts["history"]:
            t.add_row(a["rule"], a["state"], str(a["step"]), a["message"])
        parts.append(t)
    return Group(*parts)


def sparkline(values: list[float], width: int = 40) -> str:
    if len(values) > width:  # the mean of each of `width` equal slices
        n = len(values)
        values = [sum(values[i * n // width:(i + 1) * n // width]) / max(1, (i + 1) * n // width - i * n // width)
                  for i in range(width)]
    lo, hi = min(values), max(values)
    bars = "▁▂▃▄▅▆▇█"
    return "".join(bars[0 if hi == lo else round((v - lo) / (hi - lo) * 7)] for v in values)


def _f(x) -> str:
    return "" if x is None else f"{x:.2f}"
