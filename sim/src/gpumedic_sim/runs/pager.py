"""The simulated fleet's on-call pager: a real HTTP receiver on loopback for escalation webhooks.

`gpumedic sim` points report-builder's generic webhook at it and counts which incidents reached a
person; the tests use it as the receiving end of every webhook, scripting failures with
`answers` (statuses to give in order, then 200) and a slow receiver with `hang_s`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Page:
    """One webhook the pager took."""

    path: str
    headers: dict[str, str]
    body: dict


@dataclass
class Pager:
    received: list[Page] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)
    hang_s: float = 0.0
    tries: int = 0
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        assert self._server is not None, "the pager is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks/T000/B000/s3cr3t-path"

    def start(self) -> Pager:
        pager = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
                raw = self.rfile.read(length)
                pager.tries += 1
                if pager.hang_s:
                    time.sleep(pager.hang_s)
                status = pager.answers.pop(0) if pager.answers else 200
                if status == 200:
                    try:
                        pager.received.append(Page(self.path, dict(self.headers), json.loads(raw)))
                    except ValueError:
                        status = 400
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="sim-pager", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Page]:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.received

    def incidents(self) -> set[str]:
        """The incident ids paged so far."""
        return {p.body.get("incident", {}).get("id", "") for p in self.received} - {""}
