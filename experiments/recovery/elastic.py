"""Elastic scaling in a live run (the recovery study's `elastic` part), measured phase by phase: 1 replica, scale out to 2, 2 replicas, scale in to 1,
1 replica again.

`run_phases(url, token, ...)` waits until the run generates steadily (a warm-up phase, reported apart), then drives a run started with `--api-port` over its HTTP API and, per phase, counts the
groups each rollout replica put on the bus (`/rollout/engines` `groups_generated`, from the GroupQueue's
account) and the phase's wall time. A phase ends once the replicas generated `groups` more groups (twice that
with two replicas) and every replica of the phase generated at least one (with a timeout: a replica that never
serves fails the phase). Between phases the scale operation runs (its seconds are reported, the groups
generated meanwhile are counted as `transition`).

What the phases show: which engines served requests (robust on a loaded machine: a count, not a time) and
the generation rate (groups per second: the rate follows the replica count only where the rollout is the
bottleneck and cores are free; where the Actor is, the staleness gate holds generation to its pace whatever
the replica count; on a shared 2-core machine it is reported, not asserted).
"""

from __future__ import annotations

import time

TERMINAL = {"ACTIVE", "FAILED", "CANCELLED", "NOOP", "COMPLETED"}


class PhaseTimeout(AssertionError):
    pass


def _counts(client) -> dict[str, int]:
    return {e["engine_id"]: e["groups_generated"] for e in client.get("/rollout/engines").json()["engines"]}


def _wait_op(client, kind: str, body: dict, timeout: float, alive) -> dict:
    deadline = time.time() + timeout
    while body["status"] not in TERMINAL:
        if time.time() > deadline:
            raise PhaseTimeout(f"{kind} {body['request_id']} still {body['status']} after {timeout} s")
        if alive is not None and not alive():
            raise PhaseTimeout(f"the run ended during {kind}")
        time.sleep(0.2)
        body = client.get(f"/rollout/{kind}/{body['request_id']}").json()
    return body


def _phase(client, name: str, replicas: int, groups: int, timeout: float, alive, min_seconds: float) -> dict:
    start, t0 = _counts(client), time.time()
    want = groups * replicas
    while True:
        now = _counts(client)
        delta = {e: now.get(e, 0) - start.get(e, 0) for e in now}
        active = [e for e in now]
        if (sum(delta.values()) >= want and len(active) == replicas and all(delta[e] >= 1 for e in active)
                and time.time() - t0 >= min_seconds):
            break
        if time.time() - t0 > timeout:
            raise PhaseTimeout(f"phase '{name}': {delta} after {timeout} s (wanted {want} groups from {replicas} "
                               f"replicas)")
        if alive is not None and not alive():
            raise PhaseTimeout(f"the run ended during phase '{name}' ({delta})")
        time.sleep(0.1)
    seconds = time.time() - t0
    total = sum(delta.values())
    return {"phase": name, "replicas": replicas, "seconds": round(seconds, 3), "groups": total,
            "groups_by_engine": delta, "engines_serving": sum(1 for v in delta.values() if v > 0),
            "groups_per_s": round(total / seconds, 4)}


def _meanwhile(before: dict, after: dict) -> int:
    return sum(n - before.get(e, 0) for e, n in after.items())  # a removed engine leaves the list


def run_phases(url: str, token: str, groups: int = 8, timeout: float = 300.0, alive=None,
               min_seconds: float = 0.0) -> dict:
    """Phase 1 (the initial replica), scale out to 2, phase 2, scale in to 1, phase 3; each phase lasts at least
    `min_seconds` (a rate over a burst says little: the staleness gate makes generation bursty). `alive()`
    (optional) says whether the run is still going (a phase cannot finish once it ended)."""
    import httpx

    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    out: dict = {"groups_per_phase_per_replica": groups, "min_seconds": min_seconds, "phases": [], "operations": []}
    # Not counted: the run's start (roles still building models, the first weights, the first steps'
    # staleness gate) would make the first phase look slow for reasons that have nothing to do with replicas.
    out["warmup"] = _phase(client, "warm-up", 1, groups, timeout, alive, 0.0)
    out["phases"].append(_phase(client, "1 replica", 1, groups, timeout, alive, min_seconds))

    before, t0 = _counts(client), time.time()
    op = _wait_op(client, "scale_out", client.post("/rollout/scale_out", json={"num_replicas": 2}).json(), timeout, alive)
    out["operations"].append({"kind": "scale_out", "status": op["status"], "seconds": round(time.time() - t0, 3),
                              "history": [h["status"] for h in op["history"]], "weight_version": op["weight_version"],
                              "engine_ids": op["engine_ids"],
                              "groups_meanwhile": _meanwhile(before, _counts(client))})
    if op["status"] != "ACTIVE":
        raise PhaseTimeout(f"scale out ended {op['status']}: {op.get('error_message')}")
    out["phases"].append(_phase(client, "2 replicas", 2, groups, timeout, alive, min_seconds))

    before, t0 = _counts(client), time.time()
    op = _wait_op(client, "scale_in", client.post("/rollout/scale_in", json={"num_replicas": 1}).json(), timeout, alive)
    out["operations"].append({"kind": "scale_in", "status": op["status"], "seconds": round(time.time() - t0, 3),
                              "history": [h["status"] for h in op["history"]], "engine_ids": op["engine_ids"],
                              "drained": op["error_message"] is None,
                              "groups_meanwhile": _meanwhile(before, _counts(client))})
    if op["status"] != "COMPLETED":
        raise PhaseTimeout(f"scale in ended {op['status']}: {op.get('error_message')}")
    out["phases"].append(_phase(client, "1 replica again", 1, groups, timeout, alive, min_seconds))
    client.close()
    return out
