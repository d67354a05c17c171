"""`relax scale` and `relax stop`: the control API from the command line (httpx).

    relax scale --run-dir RUN out 3 --wait      # scale the rollout to 3 replicas, follow the operation
    relax scale --run-dir RUN in 1 [--force] [--dry-run] [--wait]
    relax scale --run-dir RUN engines | status ID | cancel ID | metrics
    relax stop --run-dir RUN                    # end the run early, keeping the steps done

`--run-dir` reads the address (`api.json`) and the token (`api_token`) the run wrote; `--url` and `--token`
(or RELAX_API_TOKEN) give them directly.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TERMINAL = {"ACTIVE", "FAILED", "CANCELLED", "NOOP", "COMPLETED", "DRY_RUN"}


def register(sub) -> None:
    p = sub.add_parser("scale", help="elastic rollout scaling of a running experiment (its control API)")
    _address(p)
    ops = p.add_subparsers(dest="op", required=True)
    o = ops.add_parser("out", help="scale out to NUM replicas (absolute target)")
    o.add_argument("num_replicas", type=int)
    o.add_argument("--timeout", type=float, help="per-stage timeout (s)")
    o.add_argument("--wait", action="store_true", help="poll until the operation ends")
    i = ops.add_parser("in", help="scale in to NUM replicas (replicas present at start stay)")
    i.add_argument("num_replicas", type=int)
    i.add_argument("--force", action="store_true", help="do not wait for in-flight work to drain")
    i.add_argument("--dry-run", action="store_true", help="only say which replicas would go")
    i.add_argument("--wait", action="store_true")
    ops.add_parser("engines", help="list the rollout replicas")
    ops.add_parser("metrics", help="Prometheus metrics")
    s = ops.add_parser("status", help="an operation's state")
    s.add_argument("request_id")
    c = ops.add_parser("cancel", help="cancel a scale-out")
    c.add_argument("request_id")
    p.set_defaults(func=main)
    stop = sub.add_parser("stop", help="end a running experiment early, keeping the steps done (its control API)")
    _address(stop)
    stop.set_defaults(func=stop_main)


def _address(p) -> None:
    p.add_argument("--run-dir", help="the run folder (api.json + api_token)")
    p.add_argument("--url", help="API address, e.g. http://127.0.0.1:8765")
    p.add_argument("--token", help="bearer token (default: RELAX_API_TOKEN or <run-dir>/api_token)")


def _endpoint(args) -> tuple[str, str]:
    url, token = args.url, args.token or os.environ.get("RELAX_API_TOKEN")
    if args.run_dir:
        run = Path(args.run_dir)
        try:
            url = url or json.loads((run / "api.json").read_text())["url"]
            token = token or (run / "api_token").read_text().strip()
        except FileNotFoundError as err:
            raise SystemExit(f"relax: {err.filename} not found: was the run started with --api-port?") from None
    if not url or not token:
        raise SystemExit("relax: give --run-dir, or --url and --token (or RELAX_API_TOKEN)")
    return url, token


def main(args) -> int:
    import httpx

    url, token = _endpoint(args)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        if args.op == "out":
            body = {"num_replicas": args.num_replicas, **({"timeout_secs": args.timeout} if args.timeout else {})}
            r = client.post("/rollout/scale_out", json=body)
        elif args.op == "in":
            r = client.post("/rollout/scale_in", json={"num_replicas": args.num_replicas, "force": args.force,
                                                      "dry_run": args.dry_run})
        elif args.op == "engines":
            r = client.get("/rollout/engines")
        elif args.op == "metrics":
            r = client.get("/metrics")
            print(r.text, end="")
            return 0 if r.is_success else 1
        elif args.op == "cancel":
            r = client.post(f"/rollout/scale_out/{args.request_id}/cancel")
        else:
            r = client.get(f"/rollout/scale_out/{args.request_id}")
            if r.status_code == 404:
                r = client.get(f"/rollout/scale_in/{args.request_id}")
        if not r.is_success:
            print(f"relax scale: HTTP {r.status_code}: {r.json().get('detail', r.text)}", file=sys.stderr)
            return 1
        body = r.json()
        if getattr(args, "wait", False) and body["status"] not in TERMINAL:
            kind = "scale_out" if args.op == "out" else "scale_in"
            while body["status"] not in TERMINAL:
                time.sleep(0.5)
                body = client.get(f"/rollout/{kind}/{body['request_id']}").json()
                print(f"{kind} {body['request_id'][:8]}: {body['status']}", file=sys.stderr)
        print(json.dumps(body, indent=2))
        return 0 if body.get("status") not in ("FAILED",) else 1


def post_stop(url: str, token: str):
    """POST /run/stop with the bearer token: `relax stop`, and the studies that end their own live runs."""
    import httpx

    return httpx.post(f"{url}/run/stop", headers={"Authorization": f"Bearer {token}"}, timeout=30)


def stop_main(args) -> int:
    url, token = _endpoint(args)
    r = post_stop(url, token)
    if not r.is_success:
        print(f"relax stop: HTTP {r.status_code}: {r.json().get('detail', r.text)}", file=sys.stderr)
        return 1
    print(json.dumps(r.json(), indent=2))
    return 0
