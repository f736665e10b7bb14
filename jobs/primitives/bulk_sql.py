"""The SQL of bulk operations (``jobs.primitives.expansion``): the envelope's lock, one expansion page,
and an item's outcome. Every instant is the database's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from jobs.kinds import JobKind
from jobs.storage.repository import NOTIFY_CHANNEL


@dataclass(frozen=True, slots=True)
class Envelope:
    id: int
    operation: str
    filter: dict
    options: dict
    requested_by: str
    user_id: int | None
    state: str
    cursor: int
    reason: str = ""


_ENVELOPE = """
SELECT id, operation, filter, options, requested_by, user_id, state, cursor, reason
  FROM bulk_operations WHERE id = %s
"""


def envelope(operation_id: int, *, lock: bool = False) -> Envelope | None:
    """The operation (by primary key); ``lock`` takes its row lock, which serialises the
    expansion's pages with the items' counters."""
    with connection.cursor() as cursor:
        cursor.execute(_ENVELOPE + (" FOR UPDATE" if lock else ""), [operation_id])
        row = cursor.fetchone()
    if row is None:
        return None
    # Django has psycopg hand jsonb over as text (its JSONField decodes it): so do we.
    filter_, options = (json.loads(v) if isinstance(v, str) else v for v in row[2:4])
    return Envelope(row[0], row[1], filter_, options, *row[4:])


# One page of an expansion, in one statement of the page's transaction (the caller holds the
# envelope's row lock). `page` is the operation's own keyset query (ids after the cursor, in
# id order, LIMIT the page size). Each match becomes a bulk_items row, and only a row that
# was new (ON CONFLICT DO NOTHING on bulk_items_operation_item) gets its bulk_item unit: a
# re-run over the same ids creates nothing. The unit's dedupe key is its name while it is
# live; its tenant is the operation, so one large operation gets one tenant's share of the
# claim, not the whole queue. Counts and the cursor move in the same statement.
_EXPAND_PAGE = """
WITH page AS ({page}),
items AS (
    INSERT INTO bulk_items (operation_id, item_id, state, note)
    SELECT %(op)s, id, 'pending', '' FROM page
    ON CONFLICT (operation_id, item_id) DO NOTHING
    RETURNING item_id
),
units AS (
    INSERT INTO jobs (kind, queue, payload, max_attempts, dedupe_key, tenant)
    SELECT '{kind}', %(queue)s, jsonb_build_object('operation_id', %(op)s::bigint, 'item_id', item_id),
           %(max_attempts)s, 'bulk:' || %(op)s || ':' || item_id, 'bulk:' || %(op)s
      FROM items
    ON CONFLICT DO NOTHING
    RETURNING queue
),
moved AS (
    UPDATE bulk_operations
       SET matched = matched + (SELECT count(*) FROM items),
           created = created + (SELECT count(*) FROM units),
           cursor = coalesce((SELECT max(id) FROM page), cursor)
     WHERE id = %(op)s
    RETURNING cursor
)
SELECT (SELECT count(*) FROM page), (SELECT count(*) FROM units), (SELECT cursor FROM moved),
       (SELECT count(pg_notify('{channel}', q)) FROM (SELECT DISTINCT queue AS q FROM units) n)
"""


@dataclass(frozen=True, slots=True)
class Preview:
    """What a filter matches now: how many, and the window it was drawn on (database clock)."""

    matched: int
    window_start: datetime | None  # None is "from the beginning"
    window_end: datetime


def preview(preview_sql: str, params: dict) -> Preview:
    """Run an operation's preview count (its own statement: ``jobs.primitives.expansion.BulkOp``)."""
    with connection.cursor() as c:
        c.execute(preview_sql, params)
        return Preview(*c.fetchone())


def expand_page(page_sql: str, params: dict, *, op: int, cursor: int, limit: int, queue: str, max_attempts: int):
    """Expand one page; (ids in the page, units created, the new cursor)."""
    sql = _EXPAND_PAGE.format(page=page_sql, kind=JobKind.BULK_ITEM.value, channel=NOTIFY_CHANNEL)
    with connection.cursor() as c:
        c.execute(
            sql, {**params, "op": op, "cursor": cursor, "limit": limit, "queue": queue, "max_attempts": max_attempts}
        )
        seen, created, new_cursor, _ = c.fetchone()
    return seen, created, new_cursor


# The last page: the expansion is over. `done` at once when every unit already ended
# (or there were none), `running` otherwise; the last unit to end moves it to done.
# Primary key; a cancel that got there first (state no longer expanding) wins.
_EXPANDED = """
UPDATE bulk_operations
   SET state = CASE WHEN done + refused + failed + skipped >= created THEN 'done' ELSE 'running' END,
       expanded_at = now(),
       finished_at = CASE WHEN done + refused + failed + skipped >= created THEN now() END
 WHERE id = %s AND state = 'expanding'
RETURNING state
"""


def mark_expanded(operation_id: int) -> str | None:
    with connection.cursor() as c:
        c.execute(_EXPANDED, [operation_id])
        row = c.fetchone()
    return row[0] if row else None


_FAILED = """
UPDATE bulk_operations SET state = 'failed', error = %s, finished_at = now()
 WHERE id = %s AND state = 'expanding'
"""


def mark_failed(operation_id: int, error: str) -> None:
    with connection.cursor() as c:
        c.execute(_FAILED, [error[:2000], operation_id])


# An item's outcome, compare-and-swap from the state its unit found it in (`pending`, or
# `failed` when an operator replayed its unit's dead letter) to done|refused|skipped, by
# bulk_items_operation_item: a redelivered unit whose item already ended matches nothing.
_FINISH_ITEM = """
UPDATE bulk_items SET state = %(state)s, note = %(note)s, finished_at = now()
 WHERE operation_id = %(op)s AND item_id = %(item)s AND state = %(was)s
RETURNING id
"""

# ...and the envelope's counters, in the item's transaction (primary key). A `failed` item
# that ends again moves from one counter to another; a `pending` one is one more ended.
# The operation ends with its last unit: `running` becomes done, `cancelling` cancelled.
_COUNT_ITEM = """
UPDATE bulk_operations
   SET done = done + %(done)s, refused = refused + %(refused)s, skipped = skipped + %(skipped)s,
       failed = failed - %(was_failed)s,
       state = CASE WHEN done + refused + failed + skipped + %(ended)s < created THEN state
                    WHEN state = 'running' THEN 'done'
                    WHEN state = 'cancelling' THEN 'cancelled'
                    ELSE state END,
       finished_at = CASE WHEN done + refused + failed + skipped + %(ended)s >= created
                           AND state IN ('running', 'cancelling') THEN now() ELSE finished_at END
 WHERE id = %(op)s
"""

# The states a unit acts on: its first run, or a replay of its dead letter.
ACTIONABLE = ("pending", "failed")


def item_state(operation_id: int, item_id: int) -> str | None:
    """The item's state, its row locked (the unit's transaction); None if it does not exist
    (the operation is gone). By bulk_items_operation_item."""
    with connection.cursor() as c:
        c.execute(
            "SELECT state FROM bulk_items WHERE operation_id = %s AND item_id = %s FOR UPDATE",
            [operation_id, item_id],
        )
        row = c.fetchone()
    return row[0] if row else None


def finish_item(operation_id: int, item_id: int, *, state: str, was: str, note: str) -> bool:
    """Record the item's outcome (``done``, ``refused`` or ``skipped``) and count it; False
    when it was no longer ``was`` (counted already)."""
    params: dict[str, Any] = {"op": operation_id, "item": item_id, "state": state, "was": was, "note": note[:2000]}
    with connection.cursor() as c:
        c.execute(_FINISH_ITEM, params)
        if c.fetchone() is None:
            return False
        c.execute(
            _COUNT_ITEM,
            {
                "op": operation_id,
                **{k: int(state == k) for k in ("done", "refused", "skipped")},
                "was_failed": int(was == "failed"),
                "ended": int(was == "pending"),
            },
        )
    return True
