"""Does the one-by-one enqueue still need ``vpay/prepared.py``? The same enqueue three ways,
in rotating turns in one process, so the machine's drift cancels out of the ratios:

* ``libpq``: ``vpay.prepared``'s path (``PQprepare`` once per connection, ``PQexecPrepared``);
* ``psycopg``: psycopg's own statement preparation, ``Cursor.execute(..., prepare=True)``
  on a server-binding cursor (Django's cursors bind on the client and cannot prepare);
* ``plain``: Django's cursor, parsed and planned by the server at every call.

  python bench/prepared_ab.py [--blocks 9] [--n 2000]

Uses ``bench/bench_vpay.py``'s database and its unchanged ``enqueue_tasks_one_by_one``
(``noop.enqueue()`` through the Tasks API, one durable commit each) and
``enqueue_queue_one_by_one`` (``jobs.adapters.postgres.enqueue``). ``VPAY_DB_PREPARED_STATEMENTS`` is
what turns the libpq path off in production (behind a transaction-pooling PgBouncer); here it is
flipped on the live settings between turns, and for the psycopg turn the enqueue's
``execute_prepared`` is swapped for :func:`psycopg_prepared`. Every turn starts on a new
connection (``bench_vpay.reset``), so no turn inherits another's prepared statements.
Writes ``bench/out/prepared_ab.jsonl``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_vpay  # noqa: E402  (sets DATABASE_URL and Django's settings for this process)

ARMS = ("libpq", "psycopg", "plain")


def psycopg_prepared(sql, params):
    """What ``vpay.prepared.execute_prepared`` would be on psycopg's own preparation."""
    import psycopg
    from django.db import connection

    connection.ensure_connection()
    # vpay's settings turn psycopg's preparation off (prepare_threshold None), which makes it
    # ignore prepare=True too: on for this turn's connection, as the alternative would have it.
    connection.connection.prepare_threshold = 5
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params, prepare=True)
        return cursor.fetchone() if cursor.description else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    bench_vpay.setup()
    from django.conf import settings

    from jobs.storage import repository

    libpq_path = repository.execute_prepared

    def arm(name: str) -> None:
        settings.VPAY_DB_PREPARED_STATEMENTS = name == "libpq"
        repository.execute_prepared = psycopg_prepared if name == "psycopg" else libpq_path

    paths = {"tasks": bench_vpay.enqueue_tasks_one_by_one, "queue": bench_vpay.enqueue_queue_one_by_one}
    rates: dict[tuple[str, str], list[float]] = {(p, a): [] for p in paths for a in ARMS}
    ratios: dict[tuple[str, str], list[float]] = {(p, a): [] for p in paths for a in ("psycopg", "plain")}
    for block in range(args.blocks):
        order = ARMS[block % 3 :] + ARMS[: block % 3]  # each arm first, second and last in turn
        for path, run in paths.items():
            got = {}
            for name in order:
                arm(name)
                got[name] = run(args.n)
                rates[(path, name)].append(got[name])
            for other in ("psycopg", "plain"):
                ratios[(path, other)].append(got["libpq"] / got[other])
            print(f"block {block} {path}: " + ", ".join(f"{a} {got[a]:,.0f}/s" for a in ARMS), flush=True)
    arm("libpq")
    for path in paths:
        rec = {
            "bench": "prepared_ab",
            "path": path,
            "n": args.n,
            "blocks": args.blocks,
            **{f"{a}_median": round(statistics.median(rates[(path, a)])) for a in ARMS},
            **{
                f"libpq_over_{other}_{stat}": round(fn(ratios[(path, other)]), 3)
                for other in ("psycopg", "plain")
                for stat, fn in (("median", statistics.median), ("min", min), ("max", max))
            },
            "loadavg": bench_vpay.loadavg(),
        }
        bench_vpay.emit(rec)
        print(rec, flush=True)


if __name__ == "__main__":
    main()
