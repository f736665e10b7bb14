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
  ``--concurrency`` (default 8,32; ``default``: runworker's own, not passed) at runworker's
  default processes (one per core). deliveries/s = deliveries / (first receipt → last
  receipt) at the receiver; "incl. start" counts from the worker's launch.
* latency: an idle worker (runworker's defaults), one endpoint; ``--latency-events`` (default 50)
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import target  # noqa: E402

OUT = target.OUT
DB = target.name("bench_webhooks")
DATABASE_URL = target.url(DB)

os.environ["DATABASE_URL"] = DATABASE_URL
os.environ["DJANGO_SETTINGS_MODULE"] = "vpay.settings"
os.environ.setdefault("VPAY_LOG_LEVEL", "WARNING")
os.environ["VPAY_WEBHOOK_ALLOW_CIDRS"] = "127.0.0.1/32"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.receivers import make_receiver  # noqa: E402
from bench.worker_resources import Resources  # noqa: E402

WORKER_ENV = {
    **os.environ,
    "VPAY_LOG_FORMAT": "json",
    "VPAY_WEBHOOK_FAN_OUT_IDLE": "5",
    "PYTHONUNBUFFERED": "1",
    "VPAY_DB_APPLICATION_NAME": "vpay-worker",
}
os.environ["VPAY_DB_APPLICATION_NAME"] = "bench"  # this process's own connection, not counted as the worker's


def ensure_database() -> None:
    with psycopg.connect(target.url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone():
            conn.execute(f'CREATE DATABASE "{DB}"')
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)


RESET_TABLES = (
    "webhook_delivery_attempts, webhook_deliveries, webhook_secrets, webhook_endpoints,"
    " events, jobs, processed_jobs, dead_letters"
)


def reset() -> None:
    """Empty tables whose planner statistics are those of empty tables, as autovacuum leaves a
    quiet queue: TRUNCATE alone keeps the column statistics of the run before, which a burst
    after a quiet hour would not have (jobs.maintenance.statistics)."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {RESET_TABLES} CASCADE")
        conn.execute(f"ANALYZE {RESET_TABLES}")


# With --receiver-delay: every endpoint's URL asks the sandbox receiver to answer after it.
ENDPOINT_QUERY = [""]


def setup_merchant(receiver, endpoints: int):
    import django

    django.setup()
    from merchants.services import create_merchant
    from webhooks.services.endpoints import create_endpoint

    merchant, _ = create_merchant("Bench")
    secrets = []
    for i in range(endpoints):
        url = f"http://127.0.0.1:{receiver.port}/ep{i}{ENDPOINT_QUERY[0]}"
        _, secret = create_endpoint(merchant, url=url, enabled_events=["*"])
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


WORKER_ROOT = [ROOT]  # --worker-root: run another checkout's worker against the same database (A/B)


def start_worker(concurrency: int | None) -> subprocess.Popen:
    """``runworker`` at ``concurrency`` executors a process (None: its default), with its
    default processes (one per core)."""
    command = [sys.executable, "manage.py", "runworker"]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    return subprocess.Popen(
        command,
        cwd=WORKER_ROOT[0],
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


def succeeded(conn: psycopg.Connection | None = None) -> int:
    """Deliveries succeeded so far, on ``conn`` when given (a wait loop keeps one: a new
    connection is a new server process, whose start costs the machine CPU the run measures)."""
    if conn is None:
        with psycopg.connect(DATABASE_URL, autocommit=True) as own:
            return succeeded(own)
    return conn.execute("SELECT count(*) FROM webhook_deliveries WHERE state = 'succeeded'").fetchone()[0]


def vacuum() -> None:
    """What autovacuum would do (it is off on the shared server this was written on): the
    queue's and the deliveries' dead rows reclaimed, so a long run measures vpay, not bloat."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) jobs, webhook_deliveries, webhook_delivery_attempts, events")


def throughput(
    concurrency: int | None, events: int, endpoints: int, receiver_kind: str, limit_requests: int, vacuum_every: float
) -> dict:
    reset()
    receiver = make_receiver(receiver_kind)
    try:
        merchant = setup_merchant(receiver, endpoints)
        emit(merchant, events)
        total = events * endpoints
        launched = time.time()
        worker = start_worker(concurrency)
        res = Resources(worker.pid, DB)
        cpu0, machine0, t0 = res.proc_cpu(), res.machine_cpu(), time.monotonic()
        by_command0 = res.cpu_by_role()
        deadline = time.monotonic() + 3600
        last_sample = 0.0
        last_vacuum = time.monotonic()
        # One connection, five counts a second: the loop opened a connection twenty times a
        # second, a server process started each time, counted in the machine's CPU a delivery.
        # deliveries/s is the receiver's (its stamps), not this loop's.
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            while (done := succeeded(watch)) < total and time.monotonic() < deadline:
                if time.monotonic() - last_sample >= 1.0:
                    res.sample(done)
                    last_sample = time.monotonic()
                if vacuum_every and time.monotonic() - last_vacuum >= vacuum_every:
                    vacuum()
                    last_vacuum = time.monotonic()
                time.sleep(0.2)
        cpu1, machine1, t1 = res.proc_cpu(), res.machine_cpu(), time.monotonic()
        by_command1 = res.cpu_by_role()
        res.sample(total)
        stop_worker(worker)
        got = receiver.received()
        limit = None
        if receiver_kind == "nginx" and limit_requests:
            body = sample_body()
            limit = receiver.limit(32, limit_requests, body)
    finally:
        receiver.stop()
    stamps = sorted(r["received_at"] for r in got)
    verified = sum(1 for r in got if r["verified"])
    distinct = len({(r.get("path"), r["event_id"]) for r in got})
    rate = round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 1) if len(stamps) > 1 else None
    # RSS: the first sample after a tenth of the run (imports and pools warmed) against the last.
    warm = [kib for done, kib in res.rss_kib if done >= total // 10] or [kib for _, kib in res.rss_kib]
    threads = [n for done, n in res.threads if done >= total // 10] or [n for _, n in res.threads]
    return {
        "measure": "throughput",
        "receiver": receiver_kind,
        "concurrency": "default" if concurrency is None else concurrency,
        "deliveries": total,
        "endpoints": endpoints,
        "received": len(got),
        "distinct": distinct,
        "verified": verified if receiver_kind == "sandbox" else None,
        "deliveries_per_s": rate,
        "deliveries_per_s_incl_start": round(len(stamps) / (stamps[-1] - launched), 1) if stamps else None,
        "receiver_limit_per_s": limit,
        "ratio_to_limit": round(rate / limit, 4) if rate and limit else None,
        "worker_cpu_ms_per_delivery": round((cpu1 - cpu0) * 1000 / total, 3),
        "machine_cpu_ms_per_delivery": round((machine1 - machine0) * 1000 / total, 3),
        "wall_s": round(t1 - t0, 1),
        # Processes that lived through the run only (a backend that exited is not counted).
        "cpu_ms_per_delivery_by_role": {
            name: round((by_command1[name] - by_command0.get(name, 0.0)) * 1000 / total, 3)
            for name in by_command1
            if by_command1[name] - by_command0.get(name, 0.0) > 0
        },
        "worker_backends": res.backends,
        "rss_mib_warm": round(warm[0] / 1024, 1) if warm else None,
        "rss_mib_end": round(warm[-1] / 1024, 1) if warm else None,
        "rss_mib_max": round(max(kib for _, kib in res.rss_kib) / 1024, 1) if res.rss_kib else None,
        "threads_warm": threads[0] if threads else None,
        "threads_end": threads[-1] if threads else None,
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
    }


def sample_body() -> bytes:
    """A rendered event of the size the worker sends (the limit's request body)."""
    from webhooks.models import Event
    from webhooks.services.delivery import render_body

    return render_body(Event.objects.order_by("created_at").first())


def latency(n: int, receiver_kind: str) -> dict:
    reset()
    receiver = make_receiver(receiver_kind)
    try:
        merchant = setup_merchant(receiver, 1)
        worker = start_worker(None)
        time.sleep(4)  # booted, seeded, idle
        committed: dict[str, float] = {}
        for _ in range(n):
            [event_id] = emit(merchant, 1)
            committed[event_id] = time.time()  # the commit has returned
            time.sleep(0.1)
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
        "receiver": receiver_kind,
        "events": n,
        "received": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[max(0, round(0.95 * len(ms)) - 1)], 1),
        "p99_ms": round(ms[max(0, round(0.99 * len(ms)) - 1)], 1),
        "max_ms": round(ms[-1], 1),
        "loadavg_after": open("/proc/loadavg").read().split()[:3],
    }


def run_facts(args) -> dict:
    """What a record was measured on: when, which checkout's worker (its commit), what it was told."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=WORKER_ROOT[0], capture_output=True, text=True
    ).stdout.strip()
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "worker_commit": commit,
        "worker_env": args.worker_env,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--latency-events", type=int, default=100)
    parser.add_argument("--receiver", choices=["nginx", "sandbox"], default="nginx")
    parser.add_argument(
        "--receiver-delay",
        type=float,
        default=0.0,
        help="seconds the receiver waits before answering (the sandbox receiver; real receivers take 100-300 ms)",
    )
    parser.add_argument(
        "--worker-env", action="append", default=[], metavar="NAME=VALUE", help="set for the worker (A/B runs)"
    )
    parser.add_argument(
        "--vacuum-every", type=float, default=10.0, help="seconds between VACUUMs (autovacuum's stand-in; 0: none)"
    )
    parser.add_argument("--worker-root", type=Path, help="run the worker from this checkout (same schema), for A/B")
    parser.add_argument("--limit-requests", type=int, default=200_000, help="ab -k requests for the receiver's limit")
    args = parser.parse_args()
    ensure_database()
    if args.receiver_delay:
        if args.receiver != "sandbox":
            parser.error("--receiver-delay needs --receiver sandbox (nginx answers at once)")
        ENDPOINT_QUERY[0] = f"?mode=slow&delay={args.receiver_delay}"
    if args.worker_root:
        WORKER_ROOT[0] = args.worker_root.resolve()
    for pair in args.worker_env:
        name, _, value = pair.partition("=")
        WORKER_ENV[name] = value
    results = [
        throughput(
            None if c == "default" else int(c),
            args.events,
            args.endpoints,
            args.receiver,
            args.limit_requests,
            args.vacuum_every,
        )
        for c in args.concurrency.split(",")
    ]
    if args.latency_events:
        results.append(latency(args.latency_events, args.receiver))
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "webhooks.jsonl", "a") as f:
        for r in results:
            f.write(json.dumps({**r, **run_facts(args)}) + "\n")
    print(
        "| concurrency | deliveries | received (distinct) | deliveries/s | receiver limit/s (ab -k -c 32) | ratio"
        " | worker CPU ms/delivery | machine CPU ms/delivery | worker backends | RSS MiB warm → end (max) | load after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["measure"] == "throughput":
            print(
                f"| {r['concurrency']} | {r['deliveries']} | {r['received']} ({r['distinct']}) | {r['deliveries_per_s']}"
                f" | {r['receiver_limit_per_s']} | {r['ratio_to_limit']} | {r['worker_cpu_ms_per_delivery']}"
                f" | {r['machine_cpu_ms_per_delivery']} | {r['worker_backends']}"
                f" | {r['rss_mib_warm']} → {r['rss_mib_end']} ({r['rss_mib_max']}) | {' '.join(r['loadavg_after'])} |"
            )
    for r in results:
        if r["measure"] == "throughput":
            print(f"\nCPU ms per delivery by role, concurrency {r['concurrency']}: {r['cpu_ms_per_delivery_by_role']}")
    for r in results:
        if r["measure"] == "latency":
            print(
                f"\ncommit → receipt at idle (runworker's defaults, {r['received']} of {r['events']} events 100 ms apart):"
                f" p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
