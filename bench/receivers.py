"""The webhook receivers the benchmarks deliver to, as real processes: nginx (keep-alive,
logging each receipt; the receiver that is not the bottleneck) and the sandbox receiver
(verifying every signature). Importing this changes no environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NGINX_CONF = """
worker_processes 1;
error_log {prefix}/error.log warn;
pid {prefix}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    log_format receipt '$msec $request_uri $http_vpay_event_id $http_vpay_delivery_attempt $request_length';
    client_body_buffer_size 64k;
    client_body_temp_path {prefix}/body;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            access_log {prefix}/receipts.log receipt buffer=256k flush=100ms;
            return 200 "ok";
        }}
    }}
}}
"""


class NginxReceiver:
    """nginx answering 200 to every POST over keep-alive, logging each receipt's time (its
    ``$msec``, the same host clock as the bench's) and event id. It checks no signature
    (``--receiver sandbox`` does); it is here because a Python receiver would be the
    bottleneck this benchmark measures."""

    def __init__(self) -> None:
        import shutil
        import tempfile

        if not shutil.which("nginx"):
            raise SystemExit("nginx is not installed (apt-get install nginx-light), or use --receiver sandbox")
        self.port = free_port()
        self.prefix = Path(tempfile.mkdtemp(prefix="vpay-bench-nginx-"))
        os.chmod(self.prefix, 0o755)
        (self.prefix / "nginx.conf").write_text(NGINX_CONF.format(prefix=self.prefix, port=self.port))
        self.proc = subprocess.Popen(
            ["nginx", "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start")

    def received(self) -> list[dict]:
        time.sleep(0.3)  # the access log is flushed every 100 ms
        out = []
        path = self.prefix / "receipts.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            msec, uri, event_id, _attempt, _length = line.split(" ")
            if uri.startswith("/ep"):
                out.append({"received_at": float(msec), "event_id": event_id, "path": uri, "verified": None})
        return out

    def add_secrets(self, secrets: list[str]) -> None:
        pass

    def limit(self, concurrency: int, requests: int, body: bytes) -> float:
        """Requests/s ``ab -k`` gets from this nginx with a body of the same size: the
        receiver-side limit measured beside the run."""
        body_file = self.prefix / "body.json"
        body_file.write_bytes(body)
        out = subprocess.run(
            [
                "ab",
                "-q",
                "-k",
                "-c",
                str(concurrency),
                "-n",
                str(requests),
                "-p",
                str(body_file),
                "-T",
                "application/json",
                f"http://127.0.0.1:{self.port}/limit",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return float(next(line for line in out.splitlines() if line.startswith("Requests per second")).split()[3])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class SandboxReceiver:
    """``sandbox.receiver``: verifies every signature with the shipped ``verify()``; a
    Python ThreadingHTTPServer, so it caps the rate well below the worker's."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox.receiver", "--port", str(self.port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                self._call("GET", "/__admin/health")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("receiver did not start")

    def _call(self, method: str, path: str, payload=None):
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as response:
            return json.loads(response.read())

    def received(self) -> list[dict]:
        return self._call("GET", "/__admin/received")["received"]

    def clear(self) -> None:
        self._call("DELETE", "/__admin/received")

    def add_secrets(self, secrets: list[str]) -> None:
        self._call("POST", "/__admin/secrets", {"secrets": secrets})

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def make_receiver(kind: str):
    return NginxReceiver() if kind == "nginx" else SandboxReceiver()
