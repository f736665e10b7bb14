"""Statements per settled charge, and the limits a run is compared with.

``count_statements``: a backlog (``charges_backlog``) polled in this process by a
``jobs.runner.worker.Worker`` at concurrency 1, one claimed job at a time, every statement its
connection sends counted (``connection.execute_wrapper``: savepoints included) and
grouped by shape, and the transactions committed counted from ``pg_stat_database`` (this
process is the database's only client meanwhile). The claim takes one job per statement
here; a running worker claims for all its idle executors at once and batches the finished
jobs' deletes, so the queue's share per charge is lower there.

``rail_get_rate``: the rail alone, at the worker's concurrency: the adapter's GET of a
charge the rail knows, in a loop, with nothing written.

``pgbench_commit_rate``: the database alone: a one-row insert per transaction at the same
client count (``pgbench``).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
import time
from collections import Counter

_LITERALS = re.compile(r"'[^']*'|\b\d+\b")


def _shape(sql: str) -> str:
    return " ".join(_LITERALS.sub("?", sql).split())[:110]


def count_statements(merchant_and_ids) -> dict:
    from django.db import connection

    from bench.charges_backlog import make_backlog
    from jobs.runner.worker import Worker

    merchant, ids = merchant_and_ids
    make_backlog(merchant, ids)
    worker = Worker(concurrency=1)
    shapes: Counter[str] = Counter()

    def counted(execute, sql, params, many, context):
        shapes[_shape(sql)] += 1
        return execute(sql, params, many, context)

    def commits() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            return cursor.fetchone()[0]

    before = commits()
    started, cpu_started = time.perf_counter(), time.process_time()
    polls = 0
    with connection.execute_wrapper(counted):
        while worker.run_once():
            polls += 1
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    committed = commits() - before - 2  # less this function's own two reads
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM charges WHERE status = 'succeeded' AND intent_id = ANY(%s)", [ids])
        settled = cursor.fetchone()[0]
    return {
        "settled": settled,
        "jobs_run": polls,
        "statements_per_charge": round(sum(shapes.values()) / settled, 2),
        "commits_per_charge": round(committed / settled, 2),
        "serial_ms_per_charge": round(elapsed * 1000 / settled, 2),
        # This process's CPU (the worker's Python: Django, psycopg, httpx), with the statement
        # counting's own small share: what one core's GIL allows is 1000 / this per second.
        "worker_cpu_ms_per_charge": round(cpu * 1000 / settled, 2),
        "shapes": {s: round(n / settled, 2) for s, n in shapes.most_common()},
    }


def rail_get_rate(concurrency: int, seconds: float = 5.0) -> float:
    """GETs per second the rail answers at ``concurrency`` threads (the worker's adapter)."""
    from charges.rails import get_rail
    from charges.rails.adapter import adapter_for

    adapter = adapter_for(get_rail("sandbox_push"))
    reference = "ch_bench_limit"
    adapter.submit(reference=reference, amount=1000, currency="usd")
    stop = time.monotonic() + seconds
    counts = [0] * concurrency

    def loop(k: int) -> None:
        while time.monotonic() < stop:
            adapter.status(reference=reference, pay_token=None)
            counts[k] += 1

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return round(sum(counts) / seconds, 1)


def pgbench_commit_rate(database_url: str, clients: int, seconds: int = 5) -> float:
    """Transactions per second of a one-row insert at ``clients`` connections (``pgbench``)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_limit (id bigserial PRIMARY KEY, at timestamptz DEFAULT now())")
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write("INSERT INTO bench_limit DEFAULT VALUES;\n")
        script.flush()
        out = subprocess.run(
            ["pgbench", "-n", "-c", str(clients), "-j", "2", "-T", str(seconds), "-f", script.name, database_url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return float(re.search(r"tps = ([\d.]+)", out).group(1))
