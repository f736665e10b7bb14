#!/usr/bin/env python
"""Charges benchmark: charges settled per second end to end, and confirm → settlement time.

Real processes throughout: one ``manage.py runworker`` and one ``sandbox.rail`` (the stub
rail, over HTTP on loopback), on the PostgreSQL at 127.0.0.1:5432 (role root), database
``bench_charges`` (``VPAY_BENCH_DB`` names another; dropped and created afresh, migrations
applied). Two modes, each run at every ``--concurrency`` (worker executors, default 4,16):

``worker`` -- the worker alone. A backlog of ``--charges`` submitted charges whose polls are
due, exactly as confirms leave them (``bench/charges_backlog.py``: one real confirm, its rows
copied in SQL, the rail told of each copy by its submit), then the worker is started.
settled/s = charges / (first → last ``payment_intent.succeeded`` event's ``created_at``, the
database clock): poll → GET → settlement committed, nothing else competing.

``end_to_end`` -- ``--charges`` intents (default 1000) confirmed by ``--confirmers`` threads
(default 8) calling the confirm service exactly as the API view does (commit charge + poll
job, POST to the rail, compare-and-swap + pull-forward), while the worker polls each charge
(one GET; the sandbox answers succeeded on the first poll) and settles it (charge + intent +
``payment_intent.succeeded`` event in one transaction).

* settled/s = charges / (first charge's ``created_at`` → last succeeded event's
  ``created_at``), both written by PostgreSQL: confirm → poll → event committed.
* confirm → settlement: per charge, event ``created_at`` - charge ``created_at`` (the
  charge row is written at the start of the confirm, before the rail is called); median
  and p95. The confirm's own duration (as the API caller waits for it): p50, p95, p99.

``--limits``: per concurrency, the limits measured in the same run (``bench/poll_statements.py``):
the rail alone (the adapter's GET in a loop at that many threads) and the database's commit
rate (``pgbench``, a one-row insert per transaction, that many clients); the table gives
settled/s as ratios to both. ``--statements N``: only count the statements and commits per
settled charge over a backlog of N, polled in this process, grouped by statement.

Usage (project root, the project's venv):
  python bench/bench_charges.py [--mode worker,end_to_end] [--concurrency 4,16] [--charges 1000]
                                [--confirmers 8] [--limits]
  python bench/bench_charges.py --statements 200
Results: printed as a Markdown table and appended to bench/out/charges.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import cpu_roles, target, worker_evidence  # noqa: E402

OUT = target.OUT
# VPAY_BENCH_DB (another name) keeps parallel checkouts apart, as VPAY_BENCH_DB_PREFIX does.
DB = target.name(os.environ.get("VPAY_BENCH_DB", "bench_charges"))
DATABASE_URL = target.url(DB)
WORKER_LOG = OUT / f"{DB}_worker.log"


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.receivers import free_port  # noqa: E402
from bench.sandbox_rails import sandbox_rails_file  # noqa: E402

RAIL_PORT = free_port()
RAILS_FILE = sandbox_rails_file(RAIL_PORT)
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
    with psycopg.connect(target.url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DB}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)


RESET_TABLES = (
    "provider_requests, checkout_sessions, charges, payment_intents, events, jobs, processed_jobs, dead_letters"
)


def reset() -> None:
    """Empty tables with the statistics of empty tables (as bench_webhooks.reset: TRUNCATE alone
    keeps the last run's column statistics for the next run's worker to plan on)."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {RESET_TABLES} CASCADE")
        conn.execute(f"ANALYZE {RESET_TABLES}")


def _start_worker(concurrency: int) -> subprocess.Popen:
    WORKER_LOG.parent.mkdir(parents=True, exist_ok=True)
    with WORKER_LOG.open("wb") as log:  # the child keeps its own descriptor
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    print(f"worker pid {worker.pid} (--concurrency {concurrency}), its log {WORKER_LOG}", file=sys.stderr, flush=True)
    return worker


def _new_intents(charges: int):
    from charges.models import PaymentIntent
    from merchants.services import create_merchant

    reset()
    merchant, _ = create_merchant("Bench merchant")
    intents = PaymentIntent.objects.bulk_create(
        # One amount for all: the sandbox's built-in amounts (x402, x503, x404) misbehave on purpose.
        PaymentIntent(merchant=merchant, amount=1000, currency="usd", rail="sandbox_push")
        for _ in range(charges)
    )
    return merchant, [i.id for i in intents]


# Per settled charge: confirm → event (both instants PostgreSQL's), and the event's instant.
_SETTLED = """
SELECT extract(epoch FROM e.created_at - c.created_at)::float8, c.created_at, e.created_at, c.id
  FROM charges c JOIN events e
    ON e.type = 'payment_intent.succeeded' AND e.data->>'id' = c.intent_id
 WHERE c.intent_id = ANY(%s)
"""


def _wait_settled(ids: list[str]) -> tuple[list[tuple], int]:
    """Every intent's settlement event (rows of ``_SETTLED``), and the most events any intent got."""
    deadline = time.monotonic() + 600
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        while time.monotonic() < deadline:
            # Every event of the type counts: the run started on emptied tables (reset()).
            # Matched against the run's ids, this count cost 69 ms of the database's CPU
            # five times a second, a fifth of what the worker's settlements cost it
            # (pg_stat_statements), and was counted as the worker's database time; the
            # rows read once below still match each intent.
            done = conn.execute("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'").fetchone()[0]
            if done >= len(ids):
                break
            time.sleep(0.2)
        rows = conn.execute(_SETTLED, [ids]).fetchall()
        events_per_intent = conn.execute(
            "SELECT max(n) FROM (SELECT count(*) n FROM events WHERE data->>'id' = ANY(%s) GROUP BY data->>'id') x",
            [ids],
        ).fetchone()[0]
    return rows, events_per_intent


def _pct(sorted_values: list[float], q: float) -> float:
    return round(sorted_values[max(0, int(len(sorted_values) * q) - 1)] * 1000, 1)


def _stop(worker: subprocess.Popen) -> None:
    worker.terminate()
    worker.wait(timeout=60)
    worker_evidence.log_summary(WORKER_LOG)


def run_end_to_end(concurrency: int, charges: int, confirmers: int) -> dict:
    import django

    django.setup()
    from django.db import connection

    from charges.services.confirm import confirm_intent

    merchant, ids = _new_intents(charges)
    connection.close()
    worker = _start_worker(concurrency)
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
    rows, events_per_intent = _wait_settled(ids)
    _stop(worker)

    latencies = sorted(r[0] for r in rows)
    durations.sort()
    span = (max(r[2] for r in rows) - min(r[1] for r in rows)).total_seconds()
    return {
        "mode": "end_to_end",
        "concurrency": concurrency,
        "charges": charges,
        "confirmers": confirmers,
        "settled": len(rows),
        "max_events_per_intent": events_per_intent,
        "settled_per_second": round(len(rows) / span, 1),
        "settle_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "settle_p95_ms": _pct(latencies, 0.95),
        "confirm_p50_ms": round(statistics.median(durations) * 1000, 1),
        "confirm_p95_ms": _pct(durations, 0.95),
        "confirm_p99_ms": _pct(durations, 0.99),
        "load": os.getloadavg()[0],
    }


def run_worker_alone(concurrency: int, charges: int, rail_pid: int) -> dict:
    """The worker alone: a backlog of ``charges`` submitted charges, every poll due, then
    the worker; settled/s = charges / (first → last settlement event, database clock). CPU
    ms per charge, of the machine and by role (``bench/cpu_roles.py``), from the worker's
    start to its last settlement: its start-up (about a second of CPU) is in it."""
    import django

    django.setup()
    from django.db import connection

    from bench.charges_backlog import make_backlog

    merchant, ids = _new_intents(charges)
    make_backlog(merchant, ids)
    connection.close()
    cpu0, machine0 = cpu_roles.cpu_by_role({"rail": rail_pid}, DB), cpu_roles.machine_cpu()
    worker = _start_worker(concurrency)
    rows, events_per_intent = _wait_settled(ids)
    roots = {"worker": worker.pid, "rail": rail_pid}
    cpu1, machine1 = cpu_roles.cpu_by_role(roots, DB), cpu_roles.machine_cpu()
    _stop(worker)
    span = (max(r[2] for r in rows) - min(r[2] for r in rows)).total_seconds()
    worker_evidence.report_tail(rows, DATABASE_URL, WORKER_LOG)
    return {
        "mode": "worker_alone",
        "concurrency": concurrency,
        "charges": charges,
        "confirmers": 0,
        "settled": len(rows),
        "max_events_per_intent": events_per_intent,
        "settled_per_second": round((len(rows) - 1) / span, 1),
        "machine_cpu_ms_per_charge": round((machine1 - machine0) * 1000 / charges, 2),
        "cpu_ms_per_charge_by_role": cpu_roles.per_item_ms(cpu0, cpu1, charges),
        "load": os.getloadavg()[0],
    }


def _ratio(result: dict, limit: float | None) -> str:
    return f"{result['settled_per_second'] / limit:.2f}x" if limit else "-"


def _print(results: list[dict], limits: dict) -> None:
    print(
        "| mode | worker concurrency | confirmers | charges | settled/s | ÷ rail GET/s | ÷ pgbench tps |"
        " confirm→settled p50 | p95 | confirm p50 | p99 | events per intent | load |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        rail, tps = limits.get(r["concurrency"], (None, None))
        e2e = r["mode"] == "end_to_end"
        print(
            f"| {r['mode']} | {r['concurrency']} | {r['confirmers']} | {r['settled']}/{r['charges']} |"
            f" {r['settled_per_second']} | {_ratio(r, rail)} | {_ratio(r, tps)} |"
            + (
                f" {r['settle_p50_ms']} ms | {r['settle_p95_ms']} ms | {r['confirm_p50_ms']} ms | {r['confirm_p99_ms']} ms |"
                if e2e
                else " - | - | - | - |"
            )
            + f" {r['max_events_per_intent']} | {r['load']:.1f} |"
        )
    for r in results:
        if "cpu_ms_per_charge_by_role" in r:
            roles = ", ".join(f"{role} {ms}" for role, ms in sorted(r["cpu_ms_per_charge_by_role"].items()))
            print(
                f"CPU ms a charge, {r['mode']} at {r['concurrency']}: machine {r['machine_cpu_ms_per_charge']}; {roles}"
            )
    for c, (rail, tps) in sorted(limits.items()):
        print(f"limit at {c}: rail alone {rail} GET/s, pgbench one-row insert {tps} tps")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--charges", type=int, default=1000)
    parser.add_argument("--confirmers", type=int, default=8)
    parser.add_argument(
        "--mode", default="worker,end_to_end", help="comma-separated: worker (a backlog, the worker alone), end_to_end"
    )
    parser.add_argument(
        "--limits", action="store_true", help="also measure the rail alone and pgbench, per concurrency"
    )
    parser.add_argument("--statements", type=int, default=0, help="only count statements per settled charge over N")
    args = parser.parse_args()
    ensure_database()
    rail = subprocess.Popen(
        [sys.executable, "-m", "sandbox.rail", "--port", str(RAIL_PORT)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    results, limits = [], {}
    try:
        if args.statements:
            import django

            django.setup()
            from bench.poll_statements import count_statements

            print(json.dumps(count_statements(_new_intents(args.statements)), indent=1))
            return 0
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for mode in args.mode.split(","):
                if mode == "worker":
                    results.append(run_worker_alone(concurrency, args.charges, rail.pid))
                else:
                    results.append(run_end_to_end(concurrency, args.charges, args.confirmers))
            if args.limits:
                from bench.poll_statements import pgbench_commit_rate, rail_get_rate

                limits[concurrency] = (rail_get_rate(concurrency), pgbench_commit_rate(DATABASE_URL, concurrency))
    finally:
        rail.terminate()
        rail.wait(timeout=10)
    OUT.mkdir(exist_ok=True)
    stamp = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(), "cpus": os.cpu_count()}
    with (OUT / "charges.jsonl").open("a") as fh:
        for r in results:
            rail_limit, tps = limits.get(r["concurrency"], (None, None))
            fh.write(json.dumps({**stamp, **r, "rail_get_per_second": rail_limit, "pgbench_tps": tps}) + "\n")
    _print(results, limits)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
