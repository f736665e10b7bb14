"""A real sandbox receiver process for tests (``python -m sandbox.receiver``), and helpers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """Drives a running ``sandbox.receiver`` over its admin endpoints."""

    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port = port
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def _call(self, method: str, path: str, payload=None):
        data = json.dumps(payload).encode() if payload is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def received(self, path: str | None = None) -> list[dict]:
        query = f"?path={path}" if path else ""
        return self._call("GET", "/__admin/received" + query)["received"]

    def clear(self) -> None:
        self._call("DELETE", "/__admin/received")

    def set_mode(self, path: str, mode: str, **options) -> None:
        self._call("POST", "/__admin/mode", {"path": path, "mode": mode, **options})

    def add_secrets(self, *secrets: str) -> None:
        self._call("POST", "/__admin/secrets", {"secrets": list(secrets)})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_receiver(*secrets: str) -> Receiver:
    port = free_port()
    args = [sys.executable, "-m", "sandbox.receiver", "--port", str(port)]
    for secret in secrets:
        args += ["--secret", secret]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    receiver = Receiver(port, proc)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            receiver._call("GET", "/__admin/health")
            return receiver
        except (urllib.error.URLError, ConnectionError, OSError):
            if proc.poll() is not None:
                pytest.fail("the sandbox receiver exited at startup")
            time.sleep(0.05)
    receiver.stop()
    pytest.fail("the sandbox receiver did not start")
