#!/usr/bin/env python
"""Charges benchmark: charges settled per second end to end, and confirm → settlement time.

Real processes throughout: one ``manage.py runworker`` and one ``sandbox.rail`` (the stub
rail, over HTTP on loopback), on the PostgreSQL at 127.0.0.1:5432 (role root), database
``bench_charges`` (dropped and created afresh, migrations applied).

For each ``--concurrency`` (worker loop threads, default 4,16): ``--charges`` intents
(default 1000) are created, then confirmed by ``--confirmers`` threads (default 8) calling
the confirm service exactly as the API view does (commit charge + poll job, POST to the
rail, compare-and-swap + pull-forward), while the worker polls each charge (one GET; the
sandbox answers succeeded on the first poll) and settles it (charge + intent +
``payment_intent.succeeded`` event in one transaction).

* settled/s = charges / (first charge's ``created_at`` → last succeeded event's
  ``created_at``), both written by PostgreSQL: confirm → poll → event committed.
* confirm → settlement: per charge, event ``created_at`` - charge ``created_at`` (the
  charge row is written at the start of the confirm, before the rail is called); median
  and p95. The confirm's own duration (as the API caller waits for it) is reported too.

Usage (project root, the project's venv):
  python bench/bench_charges.py [--concurrency 4,16] [--charges 1000] [--confirmers 8]
Results: printed as a Markdown table and appended to bench/out/charges.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = Path(os.environ.get("VPAY_BENCH_OUT", str(HERE / "out")))
DB = "bench_charges"
DATABASE_URL = f"postgresql://root@127.0.0.1:5432/{DB}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RAIL_PORT = free_port()
RAILS_FILE = Path(tempfile.mkdtemp()) / "rails.json"
RAILS_FILE.write_text(
    json.dumps(
        {
            "sandbox_push": {
                "base_url": f"http://127.0.0.1:{RAIL_PORT}/push",
                "flow": "push",
                "api_key": "sandbox-rail-key",
            }
        }
    )
)
os.environ.update(
    {
        "DATABASE_URL": DATABASE_URL,
        "DJANGO_SETTINGS_MODULE": "vpay.settings",
        "VPAY_RAILS_FILE": str(RAILS_FILE),
        "VPAY_LOG_LEVEL": "WARNING",
    }
)
os.environ.setdefault("VPAY_LOG_FORMAT", "json")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402


def ensure_database() -> None:
    """A fresh database each run: it holds nothing but this benchmark's rows."""
    with psycopg.connect("postgresql://root@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)


def reset() -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE provider_requests, checkout_sessions, charges, payment_intents, events, jobs,"
            " processed_jobs, dead_letters CASCADE"
        )


def run_one(concurrency: int, charges: int, confirmers: int) -> dict:
    import django

    django.setup()
    from django.db import connection

    from charges.models import PaymentIntent
    from charges.services.confirm import confirm_intent
    from merchants.services import create_merchant

    reset()
    merchant, _ = create_merchant("Bench merchant")
    intents = PaymentIntent.objects.bulk_create(
        # One amount for all: the sandbox's built-in amounts (x402, x503, x404) misbehave on purpose.
        PaymentIntent(merchant=merchant, amount=1000, currency="usd", rail="sandbox_push")
        for _ in range(charges)
    )
    ids = [i.id for i in intents]
    connection.close()

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(2.0)  # boot (migration check, seeding) before the clock starts

    durations: list[float] = []
    lock = threading.Lock()
    chunks = [ids[k::confirmers] for k in range(confirmers)]

    def confirm_all(chunk: list[str]) -> None:
        from django.db import connection as conn

        mine = []
        for intent_id in chunk:
            started = time.perf_counter()
            confirm_intent(merchant, intent_id)
            mine.append(time.perf_counter() - started)
        conn.close()
        with lock:
            durations.extend(mine)

    threads = [threading.Thread(target=confirm_all, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    deadline = time.monotonic() + 600
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        while time.monotonic() < deadline:
            done = conn.execute(
                "SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded' AND data->>'id' = ANY(%s)", [ids]
            ).fetchone()[0]
            if done >= charges:
                break
            time.sleep(0.2)
        rows = conn.execute(
            """
            SELECT extract(epoch FROM e.created_at - c.created_at)::float8, c.created_at, e.created_at
              FROM charges c JOIN events e
                ON e.type = 'payment_intent.succeeded' AND e.data->>'id' = c.intent_id
             WHERE c.intent_id = ANY(%s)
            """,
            [ids],
        ).fetchall()
        events_per_intent = conn.execute(
            "SELECT max(n) FROM (SELECT count(*) n FROM events WHERE data->>'id' = ANY(%s) GROUP BY data->>'id') x",
            [ids],
        ).fetchone()[0]
    worker.terminate()
    worker.wait(timeout=60)

    latencies = sorted(r[0] for r in rows)
    span = (max(r[2] for r in rows) - min(r[1] for r in rows)).total_seconds()
    return {
        "concurrency": concurrency,
        "charges": charges,
        "confirmers": confirmers,
        "settled": len(rows),
        "max_events_per_intent": events_per_intent,
        "settled_per_second": round(len(rows) / span, 1),
        "settle_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "settle_p95_ms": round(latencies[int(len(latencies) * 0.95) - 1] * 1000, 1),
        "confirm_p50_ms": round(statistics.median(durations) * 1000, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--charges", type=int, default=1000)
    parser.add_argument("--confirmers", type=int, default=8)
    args = parser.parse_args()
    ensure_database()
    rail = subprocess.Popen(
        [sys.executable, "-m", "sandbox.rail", "--port", str(RAIL_PORT)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    results = []
    try:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            results.append(run_one(concurrency, args.charges, args.confirmers))
    finally:
        rail.terminate()
        rail.wait(timeout=10)
    OUT.mkdir(exist_ok=True)
    stamp = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(), "cpus": os.cpu_count()}
    with (OUT / "charges.jsonl").open("a") as fh:
        for r in results:
            fh.write(json.dumps({**stamp, **r}) + "\n")
    print(
        "| worker concurrency | confirmers | charges | settled/s | confirm→settled p50 | p95 | confirm p50"
        " | events per intent |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['concurrency']} | {r['confirmers']} | {r['settled']}/{r['charges']} |"
            f" {r['settled_per_second']} |"
            f" {r['settle_p50_ms']} ms | {r['settle_p95_ms']} ms | {r['confirm_p50_ms']} ms | {r['max_events_per_intent']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
