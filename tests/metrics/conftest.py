"""A local HTTP receiver on 127.0.0.1 for alert deliveries: records every POST's path and JSON body."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    def __init__(self, status: int = 200):
        self.got: list[tuple[str, dict]] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 -- the http.server hook's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.got.append((self.path, json.loads(body or b"{}")))
                self.send_response(outer.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[dict]:
        return [body for p, body in self.got if p == path]

    def wait(self, n: int, timeout: float = 20.0) -> None:
        deadline = time.time() + timeout
        while len(self.got) < n and time.time() < deadline:
            time.sleep(0.02)


@pytest.fixture
def receiver():
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def module_receiver():
    with Receiver() as r:
        yield r
