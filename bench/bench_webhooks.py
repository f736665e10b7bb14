#!/usr/bin/env python
"""Webhook delivery benchmark: deliveries/second to a local receiver, and commit → receipt latency.

Real processes throughout: one ``manage.py runworker`` and one ``sandbox.receiver`` (the
stub webhook receiver, verifying every signature with the shipped ``verify()``), on the
PostgreSQL at 127.0.0.1:5432 (role root), database ``bench_webhooks`` (created if missing,
migrations applied).

* throughput: ``--events`` events (default 500) emitted in one transaction for a merchant
  with ``--endpoints`` endpoints (default 4) subscribed to everything, i.e. events x
  endpoints deliveries, each rendered, hashed, signed, SSRF-vetted, POSTed over its own
  pinned connection and recorded with its attempt row. Then a worker is started at each
  ``--concurrency`` (default 8,32). deliveries/s = deliveries / (first receipt → last
  receipt) at the receiver; "incl. start" counts from the worker's launch.
* latency: an idle worker (concurrency 8), one endpoint; ``--latency-events`` (default 50)
  events emitted 200 ms apart, each in its own transaction; the stamp is taken when the
  commit returned, the receipt is the receiver's ``received_at`` (same host, same clock).
  The path measured: commit → fan-out drain woken (pull_forward + NOTIFY) → delivery +
  deliver job committed → NOTIFY → deliver job claimed → attempt → receipt.

Usage (project root, the project's venv):
  python bench/bench_webhooks.py [--concurrency 8,32] [--events 500] [--endpoints 4]
Results: printed as a Markdown table and appended to bench/out/webhooks.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = Path(os.environ.get("VPAY_BENCH_OUT", str(HERE / "out")))
DB = "bench_webhooks"
DATABASE_URL = f"postgresql://root@127.0.0.1:5432/{DB}"

os.environ["DATABASE_URL"] = DATABASE_URL
os.environ["DJANGO_SETTINGS_MODULE"] = "vpay.settings"
os.environ.setdefault("VPAY_LOG_LEVEL", "WARNING")
os.environ["VPAY_WEBHOOK_ALLOW_CIDRS"] = "127.0.0.1/32"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

WORKER_ENV = {
    **os.environ,
    "VPAY_LOG_FORMAT": "json",
    "VPAY_WEBHOOK_FAN_OUT_IDLE": "5",
    "PYTHONUNBUFFERED": "1",
}


def ensure_database() -> None:
    with psycopg.connect("postgresql://root@127.0.0.1:5432/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            conn.execute(f"CREATE DATABASE {DB}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)


def reset() -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE webhook_delivery_attempts, webhook_deliveries, webhook_secrets, webhook_endpoints,"
            " events, jobs, processed_jobs, dead_letters CASCADE"
        )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
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


def setup_merchant(receiver: Receiver, endpoints: int):
    import django

    django.setup()
    from merchants.services import create_merchant
    from webhooks.services.endpoints import create_endpoint

    merchant, _ = create_merchant("Bench")
    secrets = []
    for i in range(endpoints):
        _, secret = create_endpoint(merchant, url=f"http://127.0.0.1:{receiver.port}/ep{i}", enabled_events=["*"])
        secrets.append(secret)
    receiver.add_secrets(secrets)
    return merchant


def emit(merchant, n: int) -> list[str]:
    from django.db import transaction

    from webhooks.event_types import EventType
    from webhooks.events import emit as emit_event

    with transaction.atomic():
        return [
            emit_event(
                merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": f"pi_{i}", "object": "payment_intent", "amount": i}
            ).pk
            for i in range(n)
        ]


def start_worker(concurrency: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)],
        cwd=ROOT,
        env=WORKER_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_worker(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def succeeded() -> int:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM webhook_deliveries WHERE state = 'succeeded'").fetchone()[0]


def throughput(concurrency: int, events: int, endpoints: int) -> dict:
    reset()
    receiver = Receiver()
    try:
        merchant = setup_merchant(receiver, endpoints)
        emit(merchant, events)
        total = events * endpoints
        launched = time.time()
        worker = start_worker(concurrency)
        deadline = time.monotonic() + 600
        while succeeded() < total and time.monotonic() < deadline:
            time.sleep(0.05)
        stop_worker(worker)
        got = receiver.received()
    finally:
        receiver.stop()
    stamps = sorted(r["received_at"] for r in got)
    verified = sum(1 for r in got if r["verified"])
    return {
        "measure": "throughput",
        "concurrency": concurrency,
        "deliveries": total,
        "received": len(got),
        "verified": verified,
        "deliveries_per_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 1) if len(stamps) > 1 else None,
        "deliveries_per_s_incl_start": round(len(stamps) / (stamps[-1] - launched), 1) if stamps else None,
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
    }


def latency(n: int) -> dict:
    reset()
    receiver = Receiver()
    try:
        merchant = setup_merchant(receiver, 1)
        worker = start_worker(8)
        time.sleep(4)  # booted, seeded, idle
        committed: dict[str, float] = {}
        for _ in range(n):
            [event_id] = emit(merchant, 1)
            committed[event_id] = time.time()  # the commit has returned
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        while len(receiver.received()) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        got = {r["event_id"]: r["received_at"] for r in receiver.received()}
        stop_worker(worker)
    finally:
        receiver.stop()
    ms = sorted((got[e] - t) * 1000 for e, t in committed.items() if e in got)
    return {
        "measure": "latency",
        "events": n,
        "received": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[max(0, round(0.95 * len(ms)) - 1)], 1),
        "max_ms": round(ms[-1], 1),
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--latency-events", type=int, default=50)
    args = parser.parse_args()
    ensure_database()
    results = [throughput(int(c), args.events, args.endpoints) for c in args.concurrency.split(",")]
    results.append(latency(args.latency_events))
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "webhooks.jsonl", "a") as f:
        for r in results:
            f.write(json.dumps({**r, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    print("| measure | value | detail |\n|---|---|---|")
    for r in results:
        if r["measure"] == "throughput":
            print(
                f"| deliveries/s, worker concurrency {r['concurrency']} | {r['deliveries_per_s']} "
                f"| {r['received']} of {r['deliveries']} received, {r['verified']} verified; "
                f"incl. worker start {r['deliveries_per_s_incl_start']}/s; loadavg after {' '.join(r['loadavg_after'])} |"
            )
        else:
            print(
                f"| commit → receipt p50 / p95 ms | {r['p50_ms']} / {r['p95_ms']} "
                f"| {r['received']} of {r['events']} events, 200 ms apart, idle worker (concurrency 8); "
                f"max {r['max_ms']} ms; loadavg after {' '.join(r['loadavg_after'])} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
