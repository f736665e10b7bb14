"""Every statement on ``breakers``: one read and the compare-and-swap writes that move a row.

Each write is guarded on the ``version`` the writer read, and bumps it: a write that matches
nothing means another worker moved the breaker first, and the caller re-reads and decides
again (``jobs.primitives.breakers``). Ages are measured by the statement that reads the row, on the
database clock. Every statement here goes through the primary key (``breakers_pkey``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection

from jobs.models import BREAKER_ERROR_MAX, BreakerState
from vpay.logging import redact
from vpay.pipelined import fetch_prepared


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """A breaker as read, with its ages measured by the reading statement."""

    state: BreakerState
    failures: int
    version: int | None  # None: no row yet (a breaker that never failed is closed)
    probe_token: uuid.UUID | None
    opened_age: float | None  # seconds since opened_at
    probe_age: float | None  # seconds since probe_started_at


NO_ROW = BreakerRow(BreakerState.CLOSED, 0, None, None, None, None)

# The hot path's one statement: a closed breaker costs this primary-key lookup and nothing
# else (a success on a breaker with no failures writes nothing). Prepared
# (vpay.pipelined.fetch_prepared): asked before every rail request and webhook batch, it was
# planned at every call.
_READ = """
SELECT state, failures, version, probe_token,
       extract(epoch FROM now() - opened_at)::float8,
       extract(epoch FROM now() - probe_started_at)::float8
  FROM breakers
 WHERE name = %(name)s::text
"""


def read(name: str) -> BreakerRow:
    rows = fetch_prepared(_READ, {"name": name})
    if not rows:
        return NO_ROW
    r = rows[0]
    return BreakerRow(BreakerState(r[0]), r[1], r[2], r[3], r[4], r[5])


# A vendor's first failure creates its row. Losing the race to another worker's first
# failure inserts nothing (rowcount 0): the caller re-reads and counts on that row.
_INSERT = """
INSERT INTO breakers (name, state, failures, version, opened_at, last_error, updated_at)
VALUES (%(name)s, %(state)s, %(failures)s, 1,
        CASE WHEN %(opened)s THEN now() END, %(error)s, now())
ON CONFLICT (name) DO NOTHING
"""

# Any transition or count, compare-and-swap on the version read. ``opened`` stamps a new
# cool-down's start; ``probe`` stamps the probe's token and start (and only half-open has
# one: the row's CHECK refuses a probe on another state).
_UPDATE = """
UPDATE breakers
   SET state = %(state)s,
       failures = %(failures)s,
       version = version + 1,
       opened_at = CASE WHEN %(opened)s THEN now() WHEN %(state)s = 'closed' THEN NULL ELSE opened_at END,
       probe_token = %(probe_token)s,
       probe_started_at = CASE WHEN %(probe_token)s::uuid IS NULL THEN NULL
                               WHEN %(probe)s THEN now() ELSE probe_started_at END,
       last_error = CASE WHEN %(error)s = '' THEN last_error ELSE %(error)s END,
       updated_at = now()
 WHERE name = %(name)s AND version = %(version)s
"""


def write(
    name: str,
    seen: BreakerRow,
    *,
    state: BreakerState,
    failures: int,
    opened: bool = False,
    probe_token: uuid.UUID | None = None,
    probe: bool = False,
    error: str = "",
) -> bool:
    """Move the breaker from ``seen`` (what this writer read) to the given values. Returns
    whether it matched: False means someone else wrote first.

    ``opened``: this write starts a cool-down (now). ``probe``: this write starts the probe
    ``probe_token`` (now); without it a probe token is kept as it was read."""
    params: dict[str, Any] = {
        "name": name,
        "state": str(state),
        "failures": failures,
        "opened": opened,
        "probe_token": probe_token,
        "probe": probe,
        "error": redact(error)[:BREAKER_ERROR_MAX],
        "version": seen.version,
    }
    with connection.cursor() as cursor:
        if seen.version is None:
            if probe_token is not None:
                raise ValueError("a breaker with no row cannot be probing")
            cursor.execute(_INSERT, params)
        else:
            cursor.execute(_UPDATE, params)
        return cursor.rowcount == 1


# For /metrics and the admin: every breaker not closed, and every one whose name starts with
# one of the given prefixes (the rails: few, and worth a gauge even when closed). A sequential
# scan of a small table: one row per vendor that ever failed.
_FOR_GAUGES = """
SELECT name, state, failures FROM breakers
 WHERE state <> 'closed' OR name LIKE ANY (%s)
 ORDER BY name
"""


def for_gauges(always_prefixes: list[str]) -> list[tuple[str, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute(_FOR_GAUGES, [[p.replace("%", r"\%").replace("_", r"\_") + "%" for p in always_prefixes]])
        return cursor.fetchall()


# Breakers by state, whatever their name (a gauge that stays bounded however many hosts fail).
_COUNT_BY_STATE = "SELECT split_part(name, ':', 1), state, count(*) FROM breakers GROUP BY 1, 2"


def count_by_state() -> list[tuple[str, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute(_COUNT_BY_STATE)
        return cursor.fetchall()
