"""A real local HTTP server standing in for the incident tool behind ``ALERT_WEBHOOK_URL``."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A path shaped like an incident tool's integration URL: the token is the secret part.
TOKEN = "intgr-9f8e7d6c5b4a39281706"


class AlertEndpoint:
    """Records every POST (path, headers, JSON body) and answers from a script of status
    codes (the last one repeats), e.g. ``[500, 500, 202]``."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [202])
        self.received: list[dict] = []
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                with endpoint._lock:
                    endpoint.received.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    n = len(endpoint.received)
                    status = endpoint.statuses[min(n, len(endpoint.statuses)) - 1]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):  # keep test output quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v2/enqueue/{TOKEN}?routing_key={TOKEN}"

    def bodies(self) -> list[dict]:
        with self._lock:
            return [r["body"] for r in self.received]

    def __enter__(self) -> AlertEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
