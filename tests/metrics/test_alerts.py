"""Alert rules on synthetic step sequences, delivery to a local HTTP receiver (Apprise and a plain webhook), the
rate limit, and a delivery failure that is reported once and never raised."""

from __future__ import annotations

import math

import pytest

from relax.config import AlertsConfig, ConfigError, load_config
from relax.metrics.alerts import AlertSink, check_targets
from relax.metrics.sinks import Reporter

BASE = {"reward_mean": 0.5, "loss": 0.1, "grad_norm": 1.0, "tokens": 400, "step_time_s": 1.0, "staleness_max": 0,
        "trainer_wait_s": 0.1}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sink(rules: dict, max_staleness: int = 1, **kw) -> AlertSink:
    clock = kw.pop("clock", Clock())
    return AlertSink(AlertsConfig(rules=rules, min_interval_s=kw.pop("min_interval_s", 0), **kw), max_staleness,
                     run="test", clock=clock)


def feed(s: AlertSink, rows: list[dict], start: int = 0) -> None:
    for i, row in enumerate(rows):
        s.step(start + i, {**BASE, **row})


def changes(s: AlertSink) -> list[tuple[str, str, int]]:
    """(rule, state, steps done when it changed)"""
    return [(a.rule, a.state, a.step) for a in s.history]


def test_reward_collapse_fires_after_n_low_steps_once_and_resolves():
    s = sink({"reward_collapse": {"fraction": 0.5, "steps": 2}})
    feed(s, [{"reward_mean": r} for r in (0.4, 0.6, 0.2, 0.6)])  # one low step: not enough
    assert changes(s) == []
    feed(s, [{"reward_mean": r} for r in (0.2, 0.1, 0.25, 0.2, 0.5)], start=4)
    assert changes(s) == [("reward_collapse", "firing", 6), ("reward_collapse", "resolved", 9)]
    assert "below 0.5 x its best 0.6" in s.history[0].message


def test_reward_collapse_waits_for_a_positive_best():
    s = sink({"reward_collapse": {"fraction": 0.5, "steps": 1}})
    feed(s, [{"reward_mean": r} for r in (0.0, 0.0, -0.5)])
    assert changes(s) == []


def test_non_finite_loss_or_grad_norm_fires_at_once_and_each_episode_once():
    s = sink({"non_finite": {}})
    feed(s, [{}, {}, {"loss": math.nan}, {"loss": math.nan}, {}, {"grad_norm": math.inf}, {}])
    assert changes(s) == [("non_finite", "firing", 3), ("non_finite", "resolved", 5),
                          ("non_finite", "firing", 6), ("non_finite", "resolved", 7)]
    assert "loss=nan" in s.history[0].message and "grad_norm=inf" in s.history[2].message
    s2 = sink({"non_finite": {}})
    s2.step(0, {"loss": 0.1})  # a record without grad_norm is fine
    assert changes(s2) == []


def test_throughput_below_a_share_of_its_running_median():
    s = sink({"throughput": {"fraction": 0.5, "window": 5, "min_steps": 3, "steps": 1}})
    # step 0 (pipeline fill) is slow and never counted; then 400 tokens/s, one step at 100, back to 400
    feed(s, [{"step_time_s": 20.0}, {}, {}, {}, {}, {"step_time_s": 4.0}, {}])
    assert changes(s) == [("throughput", "firing", 6), ("throughput", "resolved", 7)]
    assert "100 tokens/s" in s.history[0].message and "median 400" in s.history[0].message


def test_restarts_above_the_limit_within_the_window():
    s = sink({"restarts": {"max": 1, "window": 3}})
    feed(s, [{}, {}])
    s.event("recovery", {"role": "rollout", "replica": 0, "tier": 1, "steps_done_at_detect": 2})
    s.event("recovery", {"role": "reward", "replica": None, "tier": 1, "steps_done_at_detect": 2})
    assert changes(s) == []  # once each: within the limit
    s.event("recovery", {"role": "rollout", "replica": 0, "tier": 1, "steps_done_at_detect": 2})
    assert changes(s) == [("restarts", "firing", 2)]
    assert "rollout-0 restarted 2 time(s)" in s.history[0].message
    feed(s, [{}, {}], start=2)
    assert len(changes(s)) == 1  # still within the window: no repeat, no resolve
    feed(s, [{}], start=4)
    assert changes(s)[-1] == ("restarts", "resolved", 5)


def test_a_threshold_of_zero_fires_on_the_first_restart():
    s = sink({"restarts": {"max": 0}})
    s.event("recovery", {"role": "actor", "replica": None, "tier": 2, "steps_done_at_detect": 0})
    assert changes(s) == [("restarts", "firing", 0)]


def test_staleness_at_its_bound_for_n_steps():
    s = sink({"staleness": {"steps": 2}}, max_staleness=2)
    feed(s, [{"staleness_max": x} for x in (2, 1, 2, 2, 2, 0)])
    assert changes(s) == [("staleness", "firing", 4), ("staleness", "resolved", 6)]
    on_policy = sink({"staleness": {"steps": 1}}, max_staleness=0)  # at the bound 0 by design: never
    feed(on_policy, [{"staleness_max": 0}] * 3)
    assert changes(on_policy) == []


def test_trainer_data_wait_above_a_share():
    s = sink({"data_wait": {"share": 0.5, "steps": 2}})
    feed(s, [{"trainer_wait_s": 0.9}, {"trainer_wait_s": 0.8}, {"trainer_wait_s": 0.7}, {"trainer_wait_s": 0.1}])
    assert changes(s) == [("data_wait", "firing", 3), ("data_wait", "resolved", 4)]  # step 0 not counted


def test_a_missed_heartbeat_fires_and_resolves_when_training_goes_on():
    s = sink({"heartbeat": {"steps": 2}})
    feed(s, [{}])
    s.event("heartbeat_timeout", {"role": "reward", "pid": 123, "kind": "heartbeat_timeout"})
    s.event("recovery", {"role": "reward"})
    assert changes(s) == [("heartbeat", "firing", 1)]
    assert "reward (pid 123) missed its heartbeats" in s.history[0].message
    feed(s, [{}, {}], start=1)
    assert changes(s)[-1] == ("heartbeat", "resolved", 3)


def test_rules_left_out_are_off():
    s = sink({})
    feed(s, [{"loss": math.nan, "reward_mean": 0.0, "trainer_wait_s": 1.0, "staleness_max": 1}] * 5)
    s.event("heartbeat_timeout", {"role": "reward"})
    assert changes(s) == [] and s.rules == []


def test_delivery_through_apprise_and_a_webhook(receiver):
    cfg = dict(urls=[f"json://127.0.0.1:{receiver.port}/apprise"], webhook=receiver.url("/hook"))
    s = sink({"non_finite": {}}, **cfg)
    rep = Reporter({"alerts": s})  # as the controller feeds it
    rep.step(0, {**BASE, "loss": math.nan})
    rep.step(1, {**BASE, "loss": math.nan})
    rep.step(2, BASE)
    rep.close()
    assert rep.failed == {}
    hook, ap = receiver.at("/hook"), receiver.at("/apprise")
    assert [(m["rule"], m["state"], m["step"]) for m in hook] == [("non_finite", "firing", 1),
                                                                ("non_finite", "resolved", 3)]
    assert hook[0]["run"] == "test" and "loss=nan" in hook[0]["message"]
    assert [m["title"] for m in ap] == ["[relax] FIRING: non_finite (test)", "[relax] RESOLVED: non_finite (test)"]
    assert "loss=nan" in ap[0]["message"] and [m["type"] for m in ap] == ["failure", "success"]


def test_the_rate_limit_holds_coalesces_and_flushes_at_close(receiver):
    clock = Clock()
    s = sink({"non_finite": {}}, webhook=receiver.url("/hook"), min_interval_s=10, clock=clock)
    nan = {"loss": math.nan}
    for t, row in [(0, nan), (1, {}), (2, nan), (3, {}), (4, nan)]:  # flapping inside the interval
        clock.t = t
        feed(s, [row], start=t)
    clock.t = 12
    feed(s, [nan], start=5)  # the held state equals the one sent: a flap says nothing
    clock.t = 13
    feed(s, [{}], start=6)  # resolved, held (13 - 0 >= 10, so it goes now)
    clock.t = 14
    feed(s, [nan], start=7)  # firing, held: only 1 s after the resolved one
    s.close()  # the held firing goes out at close: the receiver ends with the true state
    assert [m["state"] for m in receiver.at("/hook")] == ["firing", "resolved", "firing"]
    assert len(s.history) == 7  # every change is kept in the status, sent or not


def test_a_failing_receiver_is_reported_once_and_never_stops_the_run(receiver, capsys):
    receiver.status = 500
    s = sink({"non_finite": {}}, webhook=receiver.url("/hook"),
             urls=["json://127.0.0.1:9/nowhere"])  # port 9 (discard): refused
    for k in range(6):
        s.step(k, {**BASE, "loss": math.nan if k % 2 == 0 else 0.1})
    s.close()
    assert len(receiver.at("/hook")) == 6  # every message was tried
    err = capsys.readouterr().err
    assert err.count("alert delivery to alerts.webhook failed") == 1
    assert err.count("alert delivery to alerts.urls.0 failed") == 1
    assert set(s.delivery_errors) == {"alerts.webhook", "alerts.urls.0"}


def test_alert_config_is_checked(tmp_path):
    base = "experiments/async/cpu.yaml"
    with pytest.raises(ConfigError, match="alerts.rules.reward_colapse"):
        load_config(base, ["alerts.rules.reward_colapse={}"])
    with pytest.raises(ConfigError, match="alerts.rules.throughput.fraction"):
        load_config(base, ["alerts.rules.throughput={fraction: 1.5}"])
    with pytest.raises(ConfigError, match="alerts.webhook"):
        load_config(base, ["alerts.webhook=ftp://x"])
    with pytest.raises(ValueError, match=r"alerts.urls.1"):
        check_targets(AlertsConfig(urls=["json://127.0.0.1/x", "notascheme://"]))
    cfg = load_config(base, ["alerts.rules.restarts={max: 0}", "alerts.min_interval_s=5"])
    assert cfg.alerts.rules.restarts.max == 0 and cfg.alerts.rules.heartbeat is None
