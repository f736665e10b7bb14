"""The planner's statistics of a table that grew far past them, refreshed within seconds.

The hot statements are prepared once per connection and most keep one generic plan
(``vpay.pipelined``), chosen from the table's statistics at the time it was planned. A queue's
tables swing from a few rows to thousands in a second (a burst of events fans out into a
delivery and a job each). A plan chosen while ``jobs`` held a few hundred rows, or before it
was ever analyzed, scans the whole table where it should probe a key: measured over a burst
of 6,000 deliveries, the hold of a batch's jobs read every job for each batch (3.5 ms where a
probe takes a tenth of one), the attempts' read scanned every delivery for eight, and the
database's CPU a delivery was 1.17-1.35 ms against 0.87 with statistics kept current
(bench/WEBHOOKS.md). Autovacuum corrects the statistics, and ANALYZE invalidates the plans
built on them, but only at its next pass over the database (``autovacuum_naptime``, a minute
by default, when it is on at all): a burst drains inside that minute.

So each worker's maintenance thread asks every ``PERIOD`` seconds, in one read of the
statistics views, which of the database's tables now hold ``GROWN_FACTOR`` times the rows
their statistics say (at least ``MIN_ROWS``), and analyzes them, the most grown first, a few
at a time. A table that shrank is left alone: a plan for a bigger table probes keys, which
stays right as it empties. One process analyzes at a time (an advisory lock; the others skip
the turn), and a table that keeps its size is never analyzed here, so a steady load costs
one read of the views a second per worker.

ANALYZE needs the table's owner (or, from PostgreSQL 17, the MAINTAIN privilege): where the
worker's role has neither, the server skips the table with a warning and autovacuum is left
to do it, as before.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

logger = logging.getLogger("jobs.runner.worker")

PERIOD = 1.0
GROWN_FACTOR = 2.0
MIN_ROWS = 1000
TABLES_A_TURN = 3

# Tables of this schema holding GROWN_FACTOR times the rows their statistics count (reltuples
# is -1 before the first ANALYZE, counted as none), most grown first. n_live_tup is the
# statistics collector's running count (each backend reports within a second of a commit),
# not a scan. The views are per database and small: no index to speak of.
_GROWN = """
SELECT s.relname
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.schemaname = current_schema()
   AND s.n_live_tup >= %(min_rows)s
   AND s.n_live_tup > %(factor)s * greatest(c.reltuples, 0)
 ORDER BY s.n_live_tup - greatest(c.reltuples, 0) DESC
 LIMIT %(limit)s
"""

# One worker process analyzes at a time: ANALYZE takes the table's SHARE UPDATE EXCLUSIVE
# lock, which another ANALYZE of it waits for, and a second pass would only repeat the first.
_TURN = "SELECT pg_try_advisory_xact_lock(hashtextextended('vpay:analyze_grown_tables', 0))"


def analyze_grown_tables() -> list[str]:
    """ANALYZE the tables that grew past their statistics (see the module); returns their
    names, or none when another worker has the turn."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_TURN)
        if not cursor.fetchone()[0]:
            return []
        cursor.execute(_GROWN, {"min_rows": MIN_ROWS, "factor": GROWN_FACTOR, "limit": TABLES_A_TURN})
        grown = [name for (name,) in cursor.fetchall()]
        for name in grown:
            # The name is the catalog's own, quoted as an identifier.
            cursor.execute(f"ANALYZE {connection.ops.quote_name(name)}")
    if grown:
        logger.info("analyzed tables that grew past their statistics", extra={"tables": grown})
    return grown
