"""Real-time alerts: rules over a run's step metrics and events, delivered through Apprise or a plain webhook.

`AlertSink` is a metrics sink (relax/metrics/sinks.py): the Reporter hands it every step's metrics (the
metrics.jsonl names: reward_mean, loss, grad_norm, tokens, step_time_s, staleness_max, trainer_wait_s, ...)
and the run's events ("recovery": a role died and is being restarted; "heartbeat_timeout": the supervisor
killed a role that stopped heartbeating). Each configured rule (`alerts.rules` in the config, thresholds as
data) says after every call whether it holds; the sink sends one message when a rule starts to hold
("firing") and one when it stops ("resolved"), never a repeat while it keeps holding.

Rate limit: per rule, a message less than `alerts.min_interval_s` after the rule's previous one is held; a
held message is sent once the interval has passed, unless the rule has gone back to the state last sent (a
flap sends nothing). At close, a held message is sent, so the receiver ends with the rule's true state.

Delivery runs in a background thread (a slow or dead receiver never stalls the supervisor's loop); a target
that fails is reported once on stderr (and in `delivery_errors`), and the run goes on.
"""

from __future__ import annotations

import logging
import math
import queue
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Callable

from relax.config import AlertsConfig

log = logging.getLogger(__name__)


def _num(m: Mapping, key: str) -> float | None:
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Rule:
    """One alert rule: `why` is a sentence while the condition holds, None while it does not."""

    name = ""

    def __init__(self, spec):
        self.spec = spec
        self.why: str | None = None

    def step(self, step: int, m: Mapping) -> None:
        pass

    def event(self, kind: str, payload: Mapping, step: int) -> None:
        pass


class Streak(Rule):
    """A condition judged per step that must hold `spec.steps` steps in a row to fire; one good step resolves."""

    def __init__(self, spec):
        super().__init__(spec)
        self.run = 0

    def bad(self, step: int, m: Mapping) -> str | None:  # a sentence when this step is bad, None when it is fine
        raise NotImplementedError

    def step(self, step: int, m: Mapping) -> None:
        why = self.bad(step, m)
        if why is None:
            self.run, self.why = 0, None
            return
        self.run += 1
        if self.run >= self.spec.steps:
            self.why = why if self.why is None else self.why  # the sentence of the step it fired on


class RewardCollapse(Streak):
    name = "reward_collapse"

    def __init__(self, spec):
        super().__init__(spec)
        self.best: float | None = None

    def bad(self, step, m):
        r = _num(m, "reward_mean")
        if r is None or not math.isfinite(r):
            return None
        best = self.best
        self.best = r if best is None else max(best, r)
        if best is not None and best > 0 and r < self.spec.fraction * best:
            return (f"reward_mean {r:.4g} at step {step} is below {self.spec.fraction:g} x its best {best:.4g} "
                    f"for {self.spec.steps} step(s)")
        return None


class NonFinite(Rule):
    name = "non_finite"

    def step(self, step, m):
        bad = [f"{k}={m[k]}" for k in self.spec.fields if _num(m, k) is not None and not math.isfinite(m[k])]
        self.why = f"non-finite {', '.join(bad)} at step {step}" if bad else None


class Throughput(Streak):
    name = "throughput"

    def __init__(self, spec):
        super().__init__(spec)
        self.recent: deque[float] = deque(maxlen=spec.window)

    def bad(self, step, m):
        tokens, dt = _num(m, "tokens"), _num(m, "step_time_s")
        if step == 0 or tokens is None or not dt or dt <= 0:  # step 0 includes the pipeline fill
            return None
        tps = tokens / dt
        median = statistics.median(self.recent) if len(self.recent) >= self.spec.min_steps else None
        self.recent.append(tps)
        if median is not None and tps < self.spec.fraction * median:
            return (f"{tps:.4g} tokens/s at step {step}, below {self.spec.fraction:g} x the running median "
                    f"{median:.4g} for {self.spec.steps} step(s)")
        return None


class Restarts(Rule):
    name = "restarts"

    def __init__(self, spec):
        super().__init__(spec)
        self.seen: list[tuple[str, int]] = []  # (role, steps done when it died)
        self.last = 0

    def _judge(self) -> None:
        self.seen = [(r, k) for r, k in self.seen if k > self.last - self.spec.window]
        counts: dict[str, int] = {}
        for r, _ in self.seen:
            counts[r] = counts.get(r, 0) + 1
        over = {r: n for r, n in counts.items() if n > self.spec.max}
        if not over:
            self.why = None
        elif self.why is None:
            self.why = "; ".join(f"{r} restarted {n} time(s) within {self.spec.window} steps (max {self.spec.max})"
                                 for r, n in sorted(over.items()))

    def event(self, kind, payload, step):
        if kind != "recovery":
            return
        role = payload.get("role", "?")
        if payload.get("replica") is not None:
            role = f"{role}-{payload['replica']}"
        self.seen.append((role, int(payload.get("steps_done_at_detect", step))))
        self._judge()

    def step(self, step, m):
        self.last = step + 1  # steps done
        self._judge()


class Staleness(Streak):
    name = "staleness"

    def __init__(self, spec, bound: int):
        super().__init__(spec)
        self.bound = bound

    def bad(self, step, m):
        s = _num(m, "staleness_max")
        if self.bound == 0 or s is None or s < self.bound:  # on-policy: at the bound (0) by design
            return None
        return f"staleness_max at its bound max_staleness={self.bound} for {self.spec.steps} step(s) (step {step})"


class DataWait(Streak):
    name = "data_wait"

    def bad(self, step, m):
        wait, dt = _num(m, "trainer_wait_s"), _num(m, "step_time_s")
        if step == 0 or wait is None or not dt or dt <= 0:
            return None
        share = wait / dt
        if share > self.spec.share:
            return (f"the trainer waited for data {share:.0%} of step {step} (above {self.spec.share:.0%}) "
                    f"for {self.spec.steps} step(s)")
        return None


class Heartbeat(Rule):
    name = "heartbeat"

    def __init__(self, spec):
        super().__init__(spec)
        self.since = 0

    def event(self, kind, payload, step):
        if kind == "heartbeat_timeout":
            self.since = 0
            self.why = self.why or (f"{payload.get('role', '?')} (pid {payload.get('pid')}) missed its heartbeats "
                                    f"and was killed")

    def step(self, step, m):
        self.since += 1
        if self.why is not None and self.since >= self.spec.steps:
            self.why = None


def build_rules(cfg: AlertsConfig, max_staleness: int) -> list[Rule]:
    r = cfg.rules
    made = {"reward_collapse": RewardCollapse, "non_finite": NonFinite, "throughput": Throughput,
            "restarts": Restarts, "data_wait": DataWait, "heartbeat": Heartbeat}
    rules: list[Rule] = [cls(getattr(r, name)) for name, cls in made.items() if getattr(r, name) is not None]
    if r.staleness is not None:
        rules.append(Staleness(r.staleness, max_staleness))
    return rules


@dataclass
class Alert:
    rule: str
    state: str  # "firing" | "resolved"
    message: str
    step: int  # steps done when it changed
    run: str
    time: float

    @property
    def title(self) -> str:
        return f"[relax] {self.state.upper()}: {self.rule} ({self.run})"


# --- delivery --------------------------------------------------------------------------------------------
class Delivery:
    """Sends alerts to every target from a daemon thread; a failing target is reported once, never raised."""

    def __init__(self, urls: list[str], webhook: str | None, timeout_s: float):
        self.targets: list[tuple[str, Callable[[Alert], None]]] = []
        for i, url in enumerate(urls):
            self.targets.append((f"alerts.urls.{i}", _apprise_sender(url, f"alerts.urls.{i}")))
        if webhook:
            self.targets.append(("alerts.webhook", _webhook_sender(webhook, timeout_s)))
        self.errors: dict[str, str] = {}  # target -> its first failure
        self.sent = 0
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="relax-alerts", daemon=True)
        if self.targets:
            self._thread.start()

    def send(self, alert: Alert) -> None:
        if self.targets:
            self._q.put(alert)

    def _work(self) -> None:
        while True:
            alert = self._q.get()
            if alert is None:
                return
            for name, send in self.targets:
                try:
                    send(alert)
                except Exception as err:  # noqa: BLE001 -- a dead receiver must never stop training
                    if name not in self.errors:
                        self.errors[name] = f"{type(err).__name__}: {err}"
                        print(f"relax: alert delivery to {name} failed (reported once; the run goes on): {err}",
                              file=sys.stderr)
            self.sent += 1

    def close(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=timeout_s)


def _apprise_sender(url: str, where: str) -> Callable[[Alert], None]:
    import apprise

    ap = apprise.Apprise()
    if not ap.add(url):
        raise ValueError(f"{where}: Apprise does not understand the URL {url!r}")

    def send(alert: Alert) -> None:
        kind = apprise.NotifyType.FAILURE if alert.state == "firing" else apprise.NotifyType.SUCCESS
        if not ap.notify(title=alert.title, body=alert.message, notify_type=kind):
            raise RuntimeError(f"Apprise could not deliver to {url.split('://')[0]}://...")

    return send


def _webhook_sender(url: str, timeout_s: float) -> Callable[[Alert], None]:
    import httpx

    def send(alert: Alert) -> None:
        r = httpx.post(url, json={**asdict(alert), "title": alert.title}, timeout=timeout_s)
        r.raise_for_status()

    return send


# --- the sink --------------------------------------------------------------------------------------------
class AlertSink:
    """A metrics sink that runs the alert rules and sends their firing / resolved messages (rate limited)."""

    def __init__(self, cfg: AlertsConfig, max_staleness: int, run: str = "run", clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.run = run
        self.clock = clock
        self.rules = build_rules(cfg, max_staleness)
        self.delivery = Delivery(cfg.urls, cfg.webhook, cfg.timeout_s)
        self.steps_done = 0
        self.history: list[Alert] = []  # every change of state, sent or not (status.json shows them)
        self._state: dict[str, str] = {r.name: "resolved" for r in self.rules}
        self._last_sent: dict[str, tuple[float, str]] = {}  # rule -> (when, state) of its last message
        self._held: dict[str, Alert] = {}

    @property
    def active(self) -> list[Alert]:
        last: dict[str, Alert] = {}
        for a in self.history:
            last[a.rule] = a
        return [a for a in last.values() if a.state == "firing"]

    @property
    def delivery_errors(self) -> dict[str, str]:
        return dict(self.delivery.errors)

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps_done = step + 1
        for rule in self.rules:
            rule.step(step, metrics)
        self._changed()

    def event(self, kind: str, payload: Mapping) -> None:
        for rule in self.rules:
            rule.event(kind, payload, self.steps_done)
        self._changed()

    def close(self) -> None:
        for name, alert in list(self._held.items()):
            self._deliver(alert)
        self._held.clear()
        self.delivery.close()

    def _changed(self) -> None:
        now = self.clock()
        for rule in self.rules:
            state = "firing" if rule.why is not None else "resolved"
            if state == self._state[rule.name]:
                continue
            self._state[rule.name] = state
            msg = rule.why if state == "firing" else f"{rule.name} is clear again after step {self.steps_done - 1}"
            alert = Alert(rule.name, state, msg, self.steps_done, self.run, now)
            self.history.append(alert)
            (log.warning if state == "firing" else log.info)("alert %s: %s", state, msg)
            self._held[rule.name] = alert
        for name, alert in list(self._held.items()):
            when, sent_state = self._last_sent.get(name, (None, "resolved"))
            if alert.state == sent_state:  # back where the receiver already is: nothing to say
                del self._held[name]
            elif when is None or now - when >= self.cfg.min_interval_s:
                del self._held[name]
                self._deliver(alert)

    def _deliver(self, alert: Alert) -> None:
        if self._last_sent.get(alert.rule, (None, "resolved"))[1] == alert.state:
            return
        self._last_sent[alert.rule] = (self.clock(), alert.state)
        self.delivery.send(alert)


def check_targets(cfg: AlertsConfig) -> None:
    """Preflight: every Apprise URL parses (raises ValueError naming alerts.urls.<i>)."""
    for i, url in enumerate(cfg.urls):
        _apprise_sender(url, f"alerts.urls.{i}")
