"""Soak: steady enqueue and drain for minutes, with and without a held xmin horizon, and with
1,000,000 delayed jobs in the table. A measuring tool, not a test.

  python bench/soak.py [--minutes 10] [--rate 300] [--concurrency 4] [--delayed 1000000] [--only-baseline]

Three phases on ``bench_vpay`` (``bench/bench_vpay.py``'s database), each ``--minutes`` long,
each with a fresh real ``runworker --concurrency N`` and a producer enqueueing ``--rate``
jobs a second in batches every 100 ms, mixed kinds (85 % ``tests.tasks.noop``, 15 %
``tests.tasks.record_after_sql_sleep`` holding its transaction 20 ms):

1. ``baseline``: nothing else;
2. ``held_horizon``: another connection holds a transaction open (REPEATABLE READ, an
   xid assigned) for the whole phase, so no dead tuple left since it began can be removed;
3. ``delayed``: first ``--delayed`` jobs due in a day are written, then as 1.

Autovacuum is off on the shared benchmark server, so each phase runs ``VACUUM jobs`` every
10 s itself, as an aggressive autovacuum would on a hot queue table. Each phase reports throughput (jobs finished a second: fence rows written, every task is
fenced), the claim's latency (a probe runs the worker's own claim statement, for one job,
every 250 ms in a transaction it rolls back, and times it), and, at its end, the dead and
live tuples and the size of ``jobs`` and its indexes. After phase 2 the horizon is
released and ``VACUUM jobs`` runs: what it reclaims is reported. Ratios against phase 1
(targets from the issue: held horizon within 2x, 1M delayed within 1.2x). Writes
``bench/out/soak.jsonl``; ``bench/SOAK.md`` holds the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_vpay  # noqa: E402  (sets DATABASE_URL and Django's settings for this process)
import psycopg  # noqa: E402

OUT = bench_vpay.OUT / "soak.jsonl"
SLOW = "tests.tasks.record_after_sql_sleep"
TABLE_STATS = """
SELECT n_live_tup, n_dead_tup, pg_relation_size('jobs'), pg_indexes_size('jobs'),
       (SELECT count(*) FROM jobs)
  FROM pg_stat_user_tables WHERE relname = 'jobs'
"""


def payload(path: str, *args) -> dict:
    return {"task": path, "args": list(args), "kwargs": {}, "backend": "default"}


def table_stats() -> dict:
    """What PostgreSQL's statistics say of ``jobs`` (they lag the table by about a second)."""
    with psycopg.connect(bench_vpay.dsn(), autocommit=True) as c:
        live, dead, size, index_size, rows = c.execute(TABLE_STATS).fetchone()
    return {"live_tup": live, "dead_tup": dead, "jobs_bytes": size, "jobs_index_bytes": index_size, "rows": rows}


def finished() -> int:
    return bench_vpay.scalar("SELECT count(*) FROM processed_jobs")


class Producer(threading.Thread):
    """``rate`` jobs a second, a batch every 100 ms, one ``enqueue_many`` statement each."""

    def __init__(self, rate: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.rate, self.stop, self.enqueued = rate, stop, 0

    def run(self) -> None:
        from django.db import connection

        from jobs.adapters import postgres as queue
        from jobs.adapters.postgres import JobRequest
        from jobs.kinds import JobKind

        per_tick = max(self.rate // 10, 1)
        rng = random.Random(7)
        next_tick = time.monotonic()
        try:
            while not self.stop.is_set():
                batch = [
                    JobRequest(JobKind.TASK, payload(SLOW, "soak", 0.02))
                    if rng.random() < 0.15
                    else JobRequest(JobKind.TASK, payload(bench_vpay.NOOP_PATH))
                    for _ in range(per_tick)
                ]
                self.enqueued += queue.enqueue_many(batch)
                next_tick += 0.1
                self.stop.wait(max(next_tick - time.monotonic(), 0))
        finally:
            connection.close()


class Vacuum(threading.Thread):
    """``VACUUM jobs`` every ``period`` seconds: what autovacuum does for a hot queue table,
    done by hand because autovacuum is off on the shared benchmark server (``SHOW
    autovacuum``). Under a held horizon it runs all the same and can remove nothing newer."""

    def __init__(self, stop: threading.Event, period: float) -> None:
        super().__init__(daemon=True)
        self.stop, self.period, self.runs, self.seconds = stop, period, 0, 0.0

    def run(self) -> None:
        with psycopg.connect(bench_vpay.dsn(), autocommit=True) as c:
            while not self.stop.wait(self.period):
                t0 = time.monotonic()
                c.execute("VACUUM jobs")
                self.seconds += time.monotonic() - t0
                self.runs += 1


class ClaimProbe(threading.Thread):
    """Times the worker's claim statement (one job) every 250 ms, rolled back."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.stop, self.ms = stop, []

    def run(self) -> None:
        from django.db import connection, transaction

        from jobs import registry
        from jobs.storage import leases

        kind_leases = {s.kind.value: s.lease_seconds for s in registry.all_specs()}
        try:
            while not self.stop.wait(0.25):
                with transaction.atomic():
                    t0 = time.perf_counter()
                    leases.claim(
                        worker="soak-probe",
                        queues=["default"],
                        kinds=[s.kind.value for s in registry.all_specs()],
                        batch=1,
                        lease_seconds=30.0,
                        kind_leases=kind_leases,
                        default_lease=60.0,
                        after="",
                        max_tenants=64,
                    )
                    self.ms.append((time.perf_counter() - t0) * 1000)
                    transaction.set_rollback(True)  # a probe takes nothing
        finally:
            connection.close()


VACUUM_EVERY = 10.0


def phase(name: str, minutes: float, rate: int, concurrency: int, extra: dict | None = None) -> dict:
    start_done = finished()
    stop = threading.Event()
    worker = bench_vpay.WorkerProc(["--concurrency", str(concurrency)], f"soak_{name}.log")
    producer, probe, vacuum = Producer(rate, stop), ClaimProbe(stop), Vacuum(stop, VACUUM_EVERY)
    producer.start()
    probe.start()
    vacuum.start()
    t0 = time.monotonic()
    samples = []
    while time.monotonic() - t0 < minutes * 60:
        time.sleep(min(30.0, minutes * 60 / 4))
        samples.append({"t": round(time.monotonic() - t0), "finished": finished() - start_done, **table_stats()})
        print(f"{name}: {samples[-1]}", flush=True)
    elapsed = time.monotonic() - t0
    done = finished() - start_done
    stop.set()
    producer.join()
    probe.join()
    vacuum.join()
    worker.stop()
    ms = sorted(probe.ms)
    rec = {
        "bench": "soak",
        "phase": name,
        "minutes": minutes,
        "rate_asked": rate,
        "concurrency": concurrency,
        "enqueued": producer.enqueued,
        "finished": done,
        "finished_per_s": round(done / elapsed, 1),
        "claim_ms_p50": round(statistics.median(ms), 3) if ms else None,
        "claim_ms_p99": round(bench_vpay.pct(ms, 0.99), 3) if ms else None,
        "claim_samples": len(ms),
        "vacuums": vacuum.runs,
        "vacuum_s": round(vacuum.seconds, 2),
        "end": table_stats(),
        "samples": samples,
        "loadavg": bench_vpay.loadavg(),
        **(extra or {}),
    }
    return rec


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded, or None when a phase measured nothing (a short run on a busy machine)."""
    return round(a / b, 3) if a is not None and b else None


def emit(rec: dict) -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "a") as f:
        f.write(json.dumps({"ts": time.time(), **rec}) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "samples"}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delayed", type=int, default=1_000_000)
    parser.add_argument("--only-baseline", action="store_true", help="phase 1 alone (a second baseline)")
    args = parser.parse_args()
    bench_vpay.setup()
    bench_vpay.sql(
        "CREATE TABLE IF NOT EXISTS test_effects (id bigserial PRIMARY KEY, label text NOT NULL,"
        " value text NOT NULL DEFAULT '', at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )

    bench_vpay.reset()
    base = phase("baseline", args.minutes, args.rate, args.concurrency)
    emit(base)
    if args.only_baseline:
        return

    bench_vpay.reset()
    horizon = psycopg.connect(bench_vpay.dsn())
    horizon.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    xid = horizon.execute("SELECT txid_current()").fetchone()[0]  # an xid: the horizon holds
    held = phase("held_horizon", args.minutes, args.rate, args.concurrency, {"held_xid": xid})
    horizon.rollback()
    horizon.close()
    before = table_stats()
    t0 = time.monotonic()
    bench_vpay.sql("VACUUM jobs")
    held["after_release_vacuum"] = {
        "vacuum_s": round(time.monotonic() - t0, 2),
        "before": before,
        "after": table_stats(),
    }
    held["vs_baseline"] = {
        "throughput": ratio(held["finished_per_s"], base["finished_per_s"]),
        "claim_p50": ratio(held["claim_ms_p50"], base["claim_ms_p50"]),
    }
    emit(held)

    bench_vpay.reset()
    from jobs.adapters import postgres as queue
    from jobs.adapters.postgres import JobRequest
    from jobs.kinds import JobKind

    t0 = time.monotonic()
    for start in range(0, args.delayed, 10_000):
        k = min(args.delayed, start + 10_000) - start
        queue.enqueue_many([JobRequest(JobKind.TASK, payload(bench_vpay.NOOP_PATH), delay=86_400.0)] * k)
    bench_vpay.settle()
    write_s = round(time.monotonic() - t0, 1)
    delayed = phase(
        "delayed", args.minutes, args.rate, args.concurrency, {"delayed_jobs": args.delayed, "write_s": write_s}
    )
    delayed["vs_baseline"] = {
        "throughput": ratio(delayed["finished_per_s"], base["finished_per_s"]),
        "claim_p50": ratio(delayed["claim_ms_p50"], base["claim_ms_p50"]),
    }
    emit(delayed)


if __name__ == "__main__":
    main()
