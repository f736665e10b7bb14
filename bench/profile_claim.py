"""What one claim costs, and what a prepared claim would save (the capacity runner's hot path).

    python bench/profile_claim.py [--n 1000] [--backlog 6000]

Three ways to run the fair claim for one job on a backlog of no-op tasks, each N times on one
connection: as the worker runs it today (``jobs.storage.sql.bookkeeping``: one simple-protocol round
trip, planned every time, asynchronous commit); prepared once with libpq and executed in
autocommit (synchronous commit); prepared and executed inside ``BEGIN; SET LOCAL
synchronous_commit TO off`` … ``COMMIT`` (three round trips). Prints microseconds per claim.
Uses the ``bench_vpay`` database (created by bench/bench_vpay.py); not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

os.environ["DATABASE_URL"] = target.url(target.name("bench_vpay"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--backlog", type=int, default=6000)
    a = ap.parse_args()
    import django

    django.setup()
    from django.db import connection

    from bench.bench_vpay import noop_payload
    from jobs import registry
    from jobs.adapters import postgres as queue
    from jobs.storage import leases, sql

    with connection.cursor() as c:
        c.execute("TRUNCATE jobs, processed_jobs, dead_letters RESTART IDENTITY")
    queue.enqueue_many(queue.JobRequest("task", noop_payload()) for _ in range(a.backlog))
    kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
    params = {
        "worker": "profile",
        "queues": ["default"],
        "kinds": [s.kind.value for s in registry.all_specs()],
        "skip": [],
        "batch": 1,
        "lease": 3.0,
        "leases": json.dumps(kind_leases),
        "default_lease": 60.0,
        "after": "",
        "max_tenants": 64,
    }
    t = time.perf_counter()
    for _ in range(a.n):
        sql.bookkeeping(leases.CLAIM, params)
    print(f"as the worker claims (planned each time, async commit): {(time.perf_counter() - t) / a.n * 1e6:.0f} µs")

    names: list[str] = []

    def dollar(m: re.Match) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    statement = re.sub(r"%\((\w+)\)s", dollar, leases.CLAIM).encode()
    connection.ensure_connection()
    pgconn = connection.connection.pgconn  # psycopg's public libpq wrapper
    pgconn.prepare(b"profile_claim", statement)

    def text(value) -> bytes | None:
        if isinstance(value, list):
            return ("{" + ",".join(value) + "}").encode()
        return None if value is None else str(value).encode()

    values = [text(params[n]) for n in names]
    t = time.perf_counter()
    for _ in range(a.n):
        pgconn.exec_prepared(b"profile_claim", values)
    print(f"prepared, autocommit (sync commit): {(time.perf_counter() - t) / a.n * 1e6:.0f} µs")
    t = time.perf_counter()
    for _ in range(a.n):
        pgconn.exec_(b"BEGIN; SET LOCAL synchronous_commit TO off")
        pgconn.exec_prepared(b"profile_claim", values)
        pgconn.exec_(b"COMMIT")
    print(f"prepared, async commit, three round trips: {(time.perf_counter() - t) / a.n * 1e6:.0f} µs")
    print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
