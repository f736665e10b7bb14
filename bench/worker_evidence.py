"""What a benchmark's worker leaves for a run slower than its neighbours: its warnings and
errors by message, and, when the last settlement came long after the rest (a poll held or
retried, not the worker's pace), that charge's rail requests and a copy of the log, read
before the next run empties the tables. Used by ``bench_charges.py``."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import psycopg

# A run's last settlement this long after its 99th percentile is reported.
TAIL_SECONDS = 5.0

# The late charge's rail requests, seconds after the run's first settlement: when it was
# asked, and what the rail said.
_LATE_REQUESTS = """
SELECT operation, round(extract(epoch FROM sent_at - %s)::numeric, 3) AS sent_s,
       round(extract(epoch FROM answered_at - sent_at)::numeric, 3) AS answered_after_s, status_code, rail_status, error
  FROM provider_requests WHERE charge_id = %s ORDER BY id
"""


def log_summary(log: Path) -> None:
    """The worker's warnings and errors in ``log`` (one JSON object a line), by message."""
    counts: collections.Counter[str] = collections.Counter()
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("level") in ("warning", "error", "critical"):
            counts[f"{record['level']}: {record.get('message', '')}"] += 1
    for message, n in counts.most_common(10):
        print(f"  worker log: {n} x {message}", file=sys.stderr)


def report_tail(rows: list[tuple], database_url: str, log: Path) -> None:
    """``rows``: (latency, charge created_at, settled_at, charge id) per charge, the database's
    instants. Says which charge settled last if it came ``TAIL_SECONDS`` after the 99th
    percentile, prints its rail requests, and copies ``log`` aside."""
    by_time = sorted(rows, key=lambda r: r[2])
    tail = (by_time[-1][2] - by_time[int(len(by_time) * 0.99) - 1][2]).total_seconds()
    if tail <= TAIL_SECONDS:
        return
    late, kept = by_time[-1][3], log.with_name(log.stem + "_stalled.log")
    print(
        f"  the last charge settled {tail:.1f} s after the 99th percentile: {late}"
        f" (its rows stay in the database until the next run; the worker's log is copied to {kept})",
        file=sys.stderr,
    )
    kept.write_bytes(log.read_bytes())
    with psycopg.connect(database_url, autocommit=True) as conn:
        for row in conn.execute(_LATE_REQUESTS, [by_time[0][2], late]).fetchall():
            print(f"    its request: {row}", file=sys.stderr)
