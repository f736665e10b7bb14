"""The sandbox rail as a real subprocess, for tests that need a rail over HTTP.

Import the fixture into a test module (``from tests.rail_support import sandbox_rail``).
One process per test session; each test gets it reset. ``ScriptedRail`` (fixture
``scripted_rail``) is a rail that answers byte for byte what a test scripts, for answers
no honest rail sends.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sandbox-rail-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SandboxRail:
    """A running ``python -m sandbox.rail`` and the calls tests make to its admin API."""

    def __init__(self, port: int, api_key: str = API_KEY) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.rail", "--port", str(port), "--api-key", api_key],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the sandbox rail did not start") from None
                time.sleep(0.05)

    def rails(self) -> dict:
        """A rails document pointing at this process (what VPAY_RAILS_FILE would hold)."""
        return {
            "sandbox_push": {"base_url": f"{self.url}/push", "flow": "push", "api_key": API_KEY},
            "sandbox_redirect": {"base_url": f"{self.url}/redirect", "flow": "redirect", "api_key": API_KEY},
        }

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self._post("/__admin/reset", {})

    def scenario(self, *, amount: int | None = None, reference: str | None = None, **fields) -> None:
        key = {"amount": amount} if amount is not None else {"reference": reference}
        self._post("/__admin/scenarios", {**key, **fields})

    def requests(self, reference: str | None = None) -> list[dict]:
        query = f"?reference={reference}" if reference else ""
        return self._get(f"/__admin/requests{query}")["requests"]

    def charge(self, reference: str) -> dict:
        """What the rail holds for a charge (``/__admin/charges/<reference>``)."""
        return self._get(f"/__admin/charges/{reference}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_process: SandboxRail | None = None


def session_rail() -> SandboxRail:
    """The one sandbox rail process of this test session, started on first use."""
    global _process
    if _process is None or _process.proc.poll() is not None:
        _process = SandboxRail(free_port())
        atexit.register(_process.stop)
    return _process


@pytest.fixture
def sandbox_rail() -> SandboxRail:
    """The session's sandbox rail, reset for this test."""
    rail = session_rail()
    rail.reset()
    return rail


class ScriptedRail:
    """A rail that answers what the test scripted, byte for byte, over real HTTP (a
    ``ThreadingHTTPServer`` on a thread of this process): the answers no honest rail sends
    and the sandbox does not play (a header of Unicode digits, a body whose
    ``Content-Encoding`` lies). ``answer(method, …)`` sets what every request with that
    method gets from then on; ``seen`` lists what arrived (method, path, headers)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        rail = self
        self.answers: dict[str, bytes] = {}
        self.seen: list[dict] = []
        self.answer("POST", 200, b'{"status": "pending"}')
        self.answer("GET", 200, b'{"status": "pending"}')

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                rail.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
                self.wfile.write(rail.answers[self.command])
                self.close_connection = True

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def answer(self, method: str, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        """Every ``method`` request is answered ``status`` with ``headers`` (sent as UTF-8,
        as written) and ``body``, then the connection is closed."""
        lines = [f"HTTP/1.1 {status} Scripted", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self.answers[method] = ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def rails(self, code: str = "scripted") -> dict:
        return {code: {"base_url": self.url, "flow": "push", "api_key": API_KEY}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted_rail():
    rail = ScriptedRail()
    yield rail
    rail.close()
