"""The sandbox rail as a real subprocess, for tests that need a rail over HTTP.

Import the fixture into a test module (``from tests.rail_support import sandbox_rail``).
One process per test session; each test gets it reset.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import sys
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
