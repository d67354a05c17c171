"""The HTTP control plane of a run (FastAPI): elastic rollout scaling, engines, health, Prometheus metrics
(relax/api/prometheus.py), the run's status and its live view, and stopping the run early (`POST /run/stop`: the
steps done are kept, summary.json says why the run ended).

Started with the run (`relax run CONFIG --api-port PORT`, port 0 picks a free one); the bearer token is
written to `<run_dir>/api_token` (mode 0600) and the address to `<run_dir>/api.json`. Every endpoint but
`/health` and `/view` requires `Authorization: Bearer <token>` (else 401), the OpenAPI schema (`/openapi.json`)
included. `/view` is a static page holding no data: it reads the token from its URL fragment
(`/view#token=...`, never sent to the server) and polls the authenticated `/status` (relax/api/view.py).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from relax.api.prometheus import exposition, registry_for
from relax.api.scaling import BadRequest, Conflict, NotFound, ScaleManager


class ScaleOutRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    num_replicas: int = Field(..., ge=1, description="target total number of rollout replicas (absolute)")
    timeout_secs: float | None = Field(None, gt=0, description="per-stage timeout of the operation")


class ScaleInRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    num_replicas: int = Field(..., ge=1, description="target number of replicas left (absolute)")
    force: bool = Field(False, description="remove without waiting for in-flight work to drain")
    dry_run: bool = Field(False, description="only report which replicas would be removed")


class OperationView(BaseModel):
    request_id: str
    kind: str
    status: str
    num_replicas: int
    engine_ids: list[str]
    failed_engines: list[str]
    error_message: str | None
    weight_version: int | None
    force: bool
    dry_run: bool
    created_at: float
    updated_at: float
    history: list[dict]


class Engine(BaseModel):
    model_config = ConfigDict(extra="allow")
    engine_id: str
    initial: bool
    status: str
    is_healthy: bool
    pid: int | None = None
    weight_version: int | None = None


class EnginesView(BaseModel):
    engines: list[Engine]
    total_engines: int


class StopView(BaseModel):
    status: str
    reason: str
    steps_done: int
    steps: int


class ErrorView(BaseModel):
    detail: str


def _codes(*codes: int) -> dict:
    text = {400: "the request cannot be honoured (the message names the limit)", 401: "missing or wrong bearer token",
            404: "no such operation", 409: "another operation is pending or running",
            501: "this run cannot be stopped over the API"}
    return {c: {"model": ErrorView, "description": text[c]} for c in codes}


def create_app(manager: ScaleManager, token: str, metrics: Callable[[], dict] | None = None,
               health: Callable[[], dict] | None = None, status: Callable[[], dict | None] | None = None,
               stop: Callable[[], dict] | None = None) -> FastAPI:
    app = FastAPI(title="Relax control API", version="1", openapi_url=None, docs_url=None, redoc_url=None,
                  description="Elastic rollout scaling and run status. Bearer token: <run_dir>/api_token.")
    bearer = HTTPBearer(auto_error=False)

    def auth(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        # bytes, not str: compare_digest raises on a non-ASCII str (headers arrive latin-1 decoded)
        given = cred.credentials.encode("utf-8", "surrogateescape") if cred is not None else b""
        if cred is None or cred.scheme.lower() != "bearer" or not secrets.compare_digest(given, token.encode()):
            raise HTTPException(401, "missing or wrong bearer token (see <run_dir>/api_token)",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # FastAPI's own 422 echoes the input, and a NaN/Infinity input cannot be written as JSON (a 500)
        detail = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
                  for e in err.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    api = APIRouter(dependencies=[Depends(auth)], responses=_codes(401))

    def op_or_404(request_id: str, kind: str) -> dict:
        try:
            return manager.get(request_id, kind).view()
        except NotFound:
            raise HTTPException(404, f"no {kind} operation {request_id}") from None

    @app.get("/health", tags=["status"])
    def get_health() -> dict:
        return {"status": "ok", "time": time.time(), **(health() if health else {})}

    @api.post("/rollout/scale_out", responses=_codes(400, 409), response_model=OperationView, tags=["scaling"])
    def scale_out(req: ScaleOutRequest) -> dict:
        try:
            return manager.scale_out(req.num_replicas, req.timeout_secs).view()
        except Conflict as err:
            raise HTTPException(409, str(err)) from None
        except BadRequest as err:
            raise HTTPException(400, str(err)) from None

    @api.get("/rollout/scale_out/{request_id}", responses=_codes(404), response_model=OperationView, tags=["scaling"])
    def get_scale_out(request_id: str) -> dict:
        return op_or_404(request_id, "scale_out")

    @api.post("/rollout/scale_out/{request_id}/cancel", responses=_codes(404, 409), response_model=OperationView, tags=["scaling"])
    def cancel_scale_out(request_id: str) -> dict:
        try:
            return manager.cancel(request_id).view()
        except NotFound:
            raise HTTPException(404, f"no scale_out operation {request_id}") from None
        except Conflict as err:
            raise HTTPException(409, str(err)) from None

    @api.post("/rollout/scale_in", responses=_codes(400, 409), response_model=OperationView, tags=["scaling"])
    def scale_in(req: ScaleInRequest) -> dict:
        try:
            return manager.scale_in(req.num_replicas, req.force, req.dry_run).view()
        except Conflict as err:
            raise HTTPException(409, str(err)) from None
        except BadRequest as err:
            raise HTTPException(400, str(err)) from None

    @api.get("/rollout/scale_in/{request_id}", responses=_codes(404), response_model=OperationView, tags=["scaling"])
    def get_scale_in(request_id: str) -> dict:
        return op_or_404(request_id, "scale_in")

    @api.post("/run/stop", responses=_codes(501), response_model=StopView, tags=["run"])
    def stop_run() -> dict:
        """End the run at the driver's next poll, keeping the steps done: summary.json (steps, steps_planned,
        the sample account) and recovery.json are written as for a run a role stopped; `relax run` exits 1."""
        if stop is None:
            raise HTTPException(501, "this server was started without a run to stop")
        return stop()

    @api.get("/rollout/engines", response_model=EnginesView, tags=["scaling"])
    def engines() -> dict:
        es = manager.pool.engines()
        return {"engines": es, "total_engines": len(es)}

    def run_metrics() -> dict:
        m = dict(metrics() if metrics else {})
        es = manager.pool.engines()
        m["rollout_replicas"] = len(es)
        m["rollout_replicas_healthy"] = sum(1 for e in es if e["is_healthy"])
        m["scale_operations"] = dict(sorted(manager.counters().items()))
        return m

    registry = registry_for(run_metrics)  # this app's own (relax/api/prometheus.py)

    # response_class Response (no media type): PlainTextResponse would document the JSON 401 as text/plain.
    @api.get("/metrics", tags=["status"], response_model=None, response_class=Response,
             responses={200: {"description": "Prometheus text (OpenMetrics when the Accept header asks for it)",
                              "content": {"text/plain": {}, "application/openmetrics-text": {}}}})
    def get_metrics(request: Request) -> Response:
        body, content_type = exposition(registry, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    @api.get("/status", tags=["status"])
    def get_status() -> dict:
        """The run's live status (relax/metrics/status.py): progress, rewards, busy shares, recoveries, alerts."""
        return (status() if status else None) or {"state": "starting"}

    @app.get("/view", response_class=HTMLResponse, tags=["status"])
    def get_view() -> str:
        """The live view: a self-contained page; open it as /view#token=<api_token> (it polls /status)."""
        from relax.api.view import PAGE

        return PAGE

    @api.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    app.include_router(api)
    return app


class ApiServer:
    """uvicorn in a daemon thread of the driver; `start()` returns once it listens."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
        self.host = host
        self.port = port
        self.thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> int:
        self.thread = threading.Thread(target=self.server.run, name="relax-api", daemon=True)
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"api: the server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)


def start_api(run_dir: Path, manager: ScaleManager, port: int, host: str = "127.0.0.1",
              metrics: Callable[[], dict] | None = None, health: Callable[[], dict] | None = None,
              stop: Callable[[], dict] | None = None) -> ApiServer:
    """Token first (the app needs it), then the server, then the address it really listens on. /status serves
    the run folder's status.json, which the controller keeps up to date."""
    from relax.run_folder import RunFolder

    token = secrets.token_urlsafe(32)
    server = ApiServer(create_app(manager, token, metrics, health, RunFolder(run_dir).status, stop), host, port)
    server.start()
    path = Path(run_dir) / "api_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    (Path(run_dir) / "api.json").write_text(json.dumps({"url": server.url, "port": server.port, "pid": os.getpid()}))
    return server
