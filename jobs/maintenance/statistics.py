"""The planner's statistics of a table that grew far past them, refreshed within seconds.

The hot statements are prepared once per connection and most keep one generic plan
(``vpay.pipelined``), chosen from the table's statistics at the time it was planned. A queue's
tables swing from a few rows to thousands in a second (a burst of events fans out into a
delivery and a job each). A plan chosen while ``jobs`` held a few hundred rows, or before it
was ever analyzed, scans the whole table where it should probe a key: measured over a burst
of 6,000 deliveries, the hold of a batch's jobs read every job for each batch (3.5 ms where a
probe takes a tenth of one), the attempts' read scanned every delivery for eight, and the
database's CPU a delivery was 0.96-1.01 ms against 0.73-0.88 with statistics kept current
(alternating runs, bench/WEBHOOKS.md). Autovacuum corrects the statistics, and ANALYZE
invalidates the plans built on them, but only at its next pass over the database
(``autovacuum_naptime``, a minute by default, when it is on at all): a burst drains inside
that minute.

So each worker's maintenance thread asks every ``PERIOD`` seconds, in one read of the
statistics views, which of the database's tables now hold ``GROWN_FACTOR`` times the rows
their statistics say (at least ``MIN_ROWS``), and analyzes the most grown of them,
``TABLES_A_TURN`` at most, each in a transaction of its own. A table that shrank is left
alone: a plan for a bigger table probes keys, which stays right as it empties. One process
analyzes at a time (an advisory lock; the others skip the turn), and a table that keeps its
size is never analyzed here, so a steady load costs one read of the views a second per
worker.

An ANALYZE here never waits for a table's lock longer than ``LOCK_TIMEOUT``: behind a
migration, a TRUNCATE or autovacuum's own VACUUM of the table it gives up (and tries again
on a later turn) rather than stall the maintenance thread, queue everything behind the lock
it waits for, or cancel the autovacuum (which yields only after ``deadlock_timeout``).

Only tables the worker's role may analyze are asked about: those whose owner it has the
privileges of, or all of them when it has those of the database's owner (a superuser has
both). Any other table is left to autovacuum, as before; on PostgreSQL 17 a role holding only
the MAINTAIN privilege is not recognised here and leaves its tables to autovacuum too.
"""

from __future__ import annotations

import logging

from django.db import OperationalError, connection, transaction
from psycopg.errors import LockNotAvailable

logger = logging.getLogger("jobs.runner.worker")

PERIOD = 1.0
GROWN_FACTOR = 2.0
MIN_ROWS = 1000
TABLES_A_TURN = 3
LOCK_TIMEOUT = "100ms"

# Tables of this schema that the role may analyze (above) holding GROWN_FACTOR times the rows
# their statistics count (reltuples is -1 before the first ANALYZE, counted as none), most
# grown first, each named schema-qualified and quoted by the server. n_live_tup is the
# cumulative statistics' running count, not a scan: a backend reports its commits at the
# first commit a second after its last report, or after about ten seconds idle, so a burst
# is seen within a second or two while the drain is busy. The views are per database and
# small: no index to speak of.
_GROWN = """
SELECT quote_ident(s.schemaname) || '.' || quote_ident(s.relname), s.relname
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.schemaname = current_schema()
   AND s.n_live_tup >= %(min_rows)s
   AND s.n_live_tup > %(factor)s * greatest(c.reltuples, 0)
   AND (pg_has_role(c.relowner, 'USAGE')
        OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE'))
 ORDER BY s.n_live_tup - greatest(c.reltuples, 0) DESC
 LIMIT %(limit)s
"""

# One worker process analyzes at a time: ANALYZE takes the table's SHARE UPDATE EXCLUSIVE
# lock, which another ANALYZE of it waits for, and a second pass would only repeat the first.
_TURN = "SELECT pg_try_advisory_xact_lock(hashtextextended('vpay:analyze_grown_tables', 0))"


def analyze_grown_tables() -> list[str]:
    """ANALYZE the tables that grew past their statistics (see the module); returns the names
    of those analyzed: none when another worker has the turn."""
    with connection.cursor() as cursor:
        cursor.execute(_GROWN, {"min_rows": MIN_ROWS, "factor": GROWN_FACTOR, "limit": TABLES_A_TURN})
        grown = cursor.fetchall()
    analyzed = []
    for qualified, name in grown:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_TURN)
                if not cursor.fetchone()[0]:
                    break
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                cursor.execute(f"ANALYZE {qualified}")  # the server quoted it (_GROWN)
        except OperationalError as exc:
            if not isinstance(exc.__cause__, LockNotAvailable):
                raise
            logger.info("a grown table was busy; analyzed on a later turn", extra={"table": name})
            continue
        analyzed.append(name)
    if analyzed:
        logger.info("analyzed tables that grew past their statistics", extra={"tables": analyzed})
    return analyzed
