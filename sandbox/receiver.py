"""A stub webhook receiver: a separate HTTP process for development, demos and tests.

    python -m sandbox.receiver --port 8200 --secret whsec_…   [--secret another …]

Every ``POST`` to a path outside ``/__admin/`` is a webhook: the receiver verifies its
``Vpay-Signature`` with the shipped :func:`webhooks.signing.verify` against every secret it
knows, records what arrived (event id, type, attempt, verified or not, and which secrets
verified it, by fingerprint), and answers according to the path's *mode*:

=========  ==================================================================
``ok``      200 (the default)
``status``  answer ``status`` (e.g. 500)
``slow``    wait ``delay`` seconds, then 200
``hang``    wait ``delay`` seconds (default an hour), then close without answering
``drop``    close the connection without answering (reset)
``endless`` 200, then an endless body
``redirect`` 302 to ``/elsewhere``
``utf16``   ``status`` (default 200) with "OK" in UTF-16 (a body with NUL bytes)
=========  ==================================================================

A path's mode comes from ``POST /__admin/mode`` (``{"path": "/hooks/a", "mode": "status",
"status": 500}``; path ``"*"`` sets the default), else from the request's own query string
(``/hooks/a?mode=slow&delay=2``), else ``ok``. Admin endpoints:

* ``GET /__admin/received`` — ``{"received": [...]}`` in arrival order (``?path=`` filters);
* ``DELETE /__admin/received`` — forget everything received;
* ``POST /__admin/secrets`` — ``{"secrets": ["whsec_…"]}`` adds secrets to verify with;
* ``GET /__admin/health`` — 200 once listening.

This is development tooling: it imports nothing of the product but the public verifier,
and nothing of the product imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from webhooks.signing import HEADER, SignatureVerificationError, verify

MAX_BODY = 1 << 20


def fingerprint(secret: str) -> str:
    """What the receiver records instead of a secret: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()[:12]


class State:
    def __init__(self, secrets: list[str], tolerance: int) -> None:
        self.lock = threading.Lock()
        self.secrets = list(secrets)
        self.tolerance = tolerance
        self.modes: dict[str, dict] = {}
        self.received: list[dict] = []

    def mode_for(self, path: str, query: dict[str, list[str]]) -> dict:
        with self.lock:
            if path in self.modes:
                return self.modes[path]
            if "*" in self.modes:
                return self.modes["*"]
        return {k: v[0] for k, v in query.items() if k in ("mode", "delay", "status")}


class Handler(BaseHTTPRequestHandler):
    server_version = "vpay-sandbox-receiver/1"
    state: State

    def log_message(self, format, *args):
        pass  # one line per webhook would drown a bench; the JSON list is the record

    # --- admin --------------------------------------------------------------------------

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/__admin/health":
            return self._json(200, {"ok": True})
        if url.path == "/__admin/received":
            wanted = parse_qs(url.query).get("path", [None])[0]
            with self.state.lock:
                rows = [r for r in self.state.received if wanted is None or r["path"] == wanted]
            return self._json(200, {"received": rows})
        return self._json(404, {"error": "not found"})

    def do_DELETE(self):
        if urlsplit(self.path).path == "/__admin/received":
            with self.state.lock:
                self.state.received.clear()
            return self._json(200, {"ok": True})
        return self._json(404, {"error": "not found"})

    def do_POST(self):
        url = urlsplit(self.path)
        body = self._body()
        if body is None:
            return None
        if url.path == "/__admin/mode":
            spec = json.loads(body or b"{}")
            with self.state.lock:
                if spec.get("mode") in (None, "ok"):
                    self.state.modes.pop(spec.get("path", "*"), None)
                else:
                    self.state.modes[spec.get("path", "*")] = spec
            return self._json(200, {"ok": True})
        if url.path == "/__admin/secrets":
            spec = json.loads(body or b"{}")
            with self.state.lock:
                self.state.secrets.extend(s for s in spec.get("secrets", []) if s not in self.state.secrets)
            return self._json(200, {"ok": True, "secrets": len(self.state.secrets)})
        return self._webhook(url, body)

    # --- webhooks -----------------------------------------------------------------------

    def _webhook(self, url, body: bytes):
        header = self.headers.get(HEADER, "")
        with self.state.lock:
            secrets = list(self.state.secrets)
        verified_by = []
        error = ""
        for secret in secrets:
            try:
                verify(body, header, secret, self.state.tolerance)
                verified_by.append(fingerprint(secret))
            except SignatureVerificationError as exc:
                error = str(exc)
        if not secrets:
            error = "the receiver knows no secret"
        try:
            event = json.loads(body)
            event_id, event_type = event.get("id"), event.get("type")
        except (ValueError, AttributeError):
            event_id = event_type = None
        mode = self.state.mode_for(url.path, parse_qs(url.query))
        record = {
            "path": url.path,
            "event_id": event_id,
            "type": event_type,
            "attempt": self.headers.get("Vpay-Delivery-Attempt"),
            "verified": bool(verified_by),
            "verified_by": verified_by,
            "error": "" if verified_by else error,
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "mode": mode.get("mode", "ok"),
            "received_at": time.time(),
        }
        with self.state.lock:
            self.state.received.append(record)
        return self._answer(mode)

    def _answer(self, mode: dict):
        name = mode.get("mode", "ok")
        delay = float(mode.get("delay", 3600 if name == "hang" else 2))
        if name == "status":
            return self._json(int(mode.get("status", 500)), {"error": "told to fail"})
        if name == "slow":
            time.sleep(delay)
            return self._json(200, {"received": True, "slow": True})
        if name == "hang":
            time.sleep(delay)
            self.close_connection = True
            return None
        if name == "drop":
            # SO_LINGER 0: close with a reset, the way a crashed receiver's kernel would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return None
        if name == "endless":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            chunk = b"x" * 65536
            try:
                while True:
                    self.wfile.write(chunk)
            except OSError:
                return None  # the client stopped reading and closed: what a bounded reader does
        if name == "utf16":
            # A .NET-style "OK" in UTF-16: NUL bytes in the body, which Postgres text refuses.
            body = "OK".encode("utf-16-le")
            self.send_response(int(mode.get("status", 200)))
            self.send_header("Content-Type", "text/plain; charset=utf-16")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return None
        if name == "redirect":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self._json(200, {"received": True})

    # --- plumbing -----------------------------------------------------------------------

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._json(413, {"error": "body too large or length missing"})
            return None
        return self.rfile.read(length)

    def _json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a bench at worker concurrency 32 opens many connections at once


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--secret", action="append", default=[], help="a signing secret to verify with (repeatable)")
    parser.add_argument("--tolerance", type=int, default=300, help="verify()'s timestamp tolerance, seconds")
    args = parser.parse_args(argv)
    if args.tolerance <= 0:
        parser.error("--tolerance must be a positive number of seconds (verify() refuses anything else)")
    handler = type("BoundHandler", (Handler,), {"state": State(args.secret, args.tolerance)})
    server = Server((args.host, args.port), handler)
    print(f"sandbox receiver listening on http://{args.host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
