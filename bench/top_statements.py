#!/usr/bin/env python
"""The statements a benchmark's database spent its time on, planning and running, from
``pg_stat_statements``: where a run's database CPU went, statement by statement.

  python bench/top_statements.py --reset                   # before the run
  python bench/bench_charges.py --mode worker ...          # the run
  python bench/top_statements.py --db bench_charges [--top 20]

Needs the extension preloaded on the benchmarks' server (``bench/target.py``), once, as a
superuser, then a restart:

  ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements';
  ALTER SYSTEM SET pg_stat_statements.track_planning = on;

The extension is created in the ``postgres`` database; its view covers every database.
Planning counted at every call (``plans`` equal to ``calls``) is a statement that is not
prepared, or one whose prepared plan the server re-plans each time (``plan_cache_mode``).
Execution time includes lock waits, which cost no CPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import target

_TOP = """
SELECT s.calls, s.plans, round(s.total_plan_time)::bigint, round(s.total_exec_time)::bigint, s.rows,
       left(regexp_replace(s.query, '\\s+', ' ', 'g'), %(width)s)
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %(db)s
 ORDER BY s.total_plan_time + s.total_exec_time DESC
 LIMIT %(top)s
"""
_TOTAL = """
SELECT coalesce(sum(s.calls), 0), round(coalesce(sum(s.total_plan_time), 0))::bigint,
       round(coalesce(sum(s.total_exec_time), 0))::bigint
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = %(db)s
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", help="the benchmark's database, as the script names it (bench_charges, ...)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--width", type=int, default=100, help="characters of each statement shown")
    parser.add_argument("--reset", action="store_true", help="forget what was counted so far")
    args = parser.parse_args()
    with psycopg.connect(target.url("postgres"), autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            if args.reset:
                conn.execute("SELECT pg_stat_statements_reset()")
                print("pg_stat_statements reset")
                return 0
            if not args.db:
                parser.error("--db is required (or --reset)")
            params = {"db": target.name(args.db), "top": args.top, "width": args.width}
            rows = conn.execute(_TOP, params).fetchall()
            calls, plan, run = conn.execute(_TOTAL, params).fetchone()
        except (
            psycopg.errors.ObjectNotInPrerequisiteState,
            psycopg.errors.FeatureNotSupported,
            psycopg.errors.UndefinedFile,
        ) as exc:
            # Not preloaded (55000), or not installed on the server at all (0A000, 58P01).
            print(f"pg_stat_statements is not usable on this server ({exc.sqlstate}): see this script's docstring",
                  file=sys.stderr)  # fmt: skip
            return 2
    print(f"{target.name(args.db)}: {calls:,} calls, {plan:,} ms planning, {run:,} ms running")
    print("| calls | plans | planning ms | running ms | rows | statement |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, plans, plan_ms, run_ms, nrows, text in rows:
        print(f"| {n:,} | {plans:,} | {plan_ms:,} | {run_ms:,} | {nrows:,} | `{text}` |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
