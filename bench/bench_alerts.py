#!/usr/bin/env python
"""Dead letters and their alerts: what the alert costs the dead-letter write, and how fast
a worker sends alerts.

On the PostgreSQL at 127.0.0.1:5432 (role root), database ``bench_alerts`` (created if
missing, migrations applied, emptied first):

* dead-letter write: ``--jobs`` task jobs (default 2000) are enqueued and claimed, then
  dead-lettered one by one with the worker's own settle statement
  (``jobs.storage.repository.dead_letter``: delete + dead letter + ``alerts`` row + ``send_alert``
  job, one asynchronous-commit round trip), and, as the baseline, the same number through
  the statement as it was before alerts (delete + dead letter only). Median and p95 per
  job, in microseconds.
* alert sending: the ``--jobs`` ``send_alert`` jobs just written are drained by one real
  ``manage.py runworker --burst --concurrency N`` (default 4) POSTing to a local HTTP
  endpoint (stdlib ``http.server``, answering 202 at once). alerts/s = POSTs received /
  wall time of the worker process (its start-up included).

Usage (project root, the project's venv):  python bench/bench_alerts.py [--jobs 2000] [--concurrency 4]
Results: printed, and appended to bench/out/alerts.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

DB = target.name("bench_alerts")
URL = target.url(DB)


def setup_django() -> None:
    import psycopg

    with psycopg.connect(target.url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = URL
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def empty_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs, dead_letters, alerts, processed_jobs")


def claimed_jobs(n: int) -> list:
    from jobs import registry
    from jobs.adapters import postgres as queue
    from jobs.kinds import JobKind
    from jobs.storage import leases

    queue.enqueue_many(
        queue.JobRequest("task", {"task": "bench.nowhere", "args": [i], "kwargs": {}}, max_attempts=1) for i in range(n)
    )
    kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
    jobs = []
    while len(jobs) < n:
        got = leases.claim(
            worker="bench",
            queues=["default"],
            kinds=[k.value for k in JobKind],
            batch=500,
            lease_seconds=600,
            kind_leases=kind_leases,
            default_lease=600,
            after="",
            max_tenants=64,
        ).jobs
        if not got:
            break
        jobs.extend(j for j in got if j.kind == "task")
    return jobs


# The dead-letter statement before alerts, for the baseline.
_OLD = """
WITH gone AS (DELETE FROM jobs WHERE id = %(id)s AND lease_token = %(token)s RETURNING *)
INSERT INTO dead_letters (job_id, kind, queue, payload, priority, tenant, correlation_id, attempts,
                          max_attempts, cause, error_category, last_error, job_created_at, dedupe_key)
SELECT job_id, kind, queue, payload, priority, tenant, correlation_id, attempts,
       max_attempts, %(cause)s, %(category)s, %(error)s, created_at, dedupe_key
  FROM gone
RETURNING id
"""


def time_dead_letters(n: int, *, with_alerts: bool) -> list[float]:
    from jobs.storage import repository, sql

    jobs = claimed_jobs(n)
    samples = []
    for job in jobs:
        start = time.perf_counter()
        if with_alerts:
            repository.dead_letter(job.id, job.lease_token, cause="permanent", category="permanent", error="boom")
        else:
            sql.bookkeeping(
                _OLD,
                {
                    "id": job.id,
                    "token": job.lease_token,
                    "cause": "permanent",
                    "category": "permanent",
                    "error": "boom",
                },
            )
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


class Endpoint:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer.lock:
                    outer.count += 1
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/alerts/intgr-bench"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    setup_django()

    empty_tables()
    baseline = time_dead_letters(args.jobs, with_alerts=False)
    empty_tables()
    alerted = time_dead_letters(args.jobs, with_alerts=True)

    endpoint = Endpoint()
    env = {**os.environ, "DATABASE_URL": URL, "ALERT_WEBHOOK_URL": endpoint.url, "VPAY_LOG_LEVEL": "WARNING"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "manage.py", "runworker", "--burst", "--concurrency", str(args.concurrency)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]

    def pct(samples, q):
        return statistics.quantiles(samples, n=100)[q - 1]

    result = {
        "jobs": args.jobs,
        "dead_letter_us_p50_without_alert": round(statistics.median(baseline), 1),
        "dead_letter_us_p95_without_alert": round(pct(baseline, 95), 1),
        "dead_letter_us_p50_with_alert": round(statistics.median(alerted), 1),
        "dead_letter_us_p95_with_alert": round(pct(alerted, 95), 1),
        "alerts_posted": endpoint.count,
        "worker_concurrency": args.concurrency,
        "worker_wall_s": round(wall, 2),
        "alerts_per_s_incl_start": round(endpoint.count / wall, 1),
    }
    print(json.dumps(result, indent=2))
    out = target.OUT
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "alerts.jsonl", "a") as handle:
        handle.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}) + "\n")


if __name__ == "__main__":
    main()
