"""Per-merchant rate limits on ``/v1``: a fixed window counted in PostgreSQL.

Every web process shares one counter row per merchant (``api_rate_limit_windows``), so a
limit holds however many processes serve the API, with no Redis. Each authenticated
request costs one upsert, in autocommit before the view's transaction, so the row's lock
is held for that statement only. Windows are aligned on the database clock
(``date_bin``), which also says how long until the next one (``Retry-After``).

A fixed window lets a merchant burst up to twice the limit across a window boundary; at
one-second windows that is the price of one statement per request instead of a bucket's
read-compute-write.

Settings: ``VPAY_API_RATE_LIMIT`` requests per ``VPAY_API_RATE_LIMIT_WINDOW_SECONDS``
(0 switches the limit off).

:func:`rate_limit_key` is the same window for anything else that must be bounded (the
token endpoint per client and per source address, a merchant's webhook test events): one
row per key in ``api_rate_limit_keys``, which the hourly sweep empties of windows long over.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import connection

from jobs.maintenance.housekeeping import StepResult, delete_in_rounds
from jobs.runner.context import JobContext
from vpay.errors import RateLimited

KEY_MAX = 200  # api_rate_limit_keys.key
SWEEP_PAGE = 1000
MAX_SWEEP_PAGES = 50


def rate_limit_charge(*, merchant_id: str) -> None:
    """Count one request for the merchant; :class:`RateLimited` when it is over the limit.

    A refused request is counted too: a client hammering through its 429s stays refused.
    """
    limit = settings.VPAY_API_RATE_LIMIT
    if limit <= 0:
        return
    window = settings.VPAY_API_RATE_LIMIT_WINDOW_SECONDS
    with connection.cursor() as cursor:
        # One statement per request, on the primary key (merchant_id): start the merchant's
        # row, count into the current window, or restart it when a new window has begun.
        # Only unindexed columns change, so the update is HOT. Returns the count and the
        # seconds left in the window, both read from the database clock.
        cursor.execute(
            "INSERT INTO api_rate_limit_windows AS w (merchant_id, window_start, count)"
            " VALUES (%s, date_bin(make_interval(secs => %s), now(), timestamptz 'epoch'), 1)"
            " ON CONFLICT (merchant_id) DO UPDATE SET"
            " count = CASE WHEN w.window_start = EXCLUDED.window_start THEN w.count + 1 ELSE 1 END,"
            " window_start = EXCLUDED.window_start"
            " RETURNING count, extract(epoch FROM w.window_start + make_interval(secs => %s) - now())",
            [merchant_id, window, window],
        )
        count, seconds_left = cursor.fetchone()
    if count > limit:
        raise RateLimited(
            "rate_limited",
            f"Too many requests: at most {limit} per {window} s for a merchant. Retry after the Retry-After seconds.",
            retry_after=max(1, math.ceil(float(seconds_left))),
        )


def rate_limit_key(*, key: str, limit: int, window: int, what: str) -> None:
    """Count one use of ``key`` (``"<purpose>:<subject>"``, at most :data:`KEY_MAX`
    characters); :class:`RateLimited` once it is over ``limit`` per ``window`` seconds.
    ``what`` ends the refusal's message ("for a client"). ``limit`` 0: no limit."""
    if limit <= 0:
        return
    with connection.cursor() as cursor:
        # The same upsert as rate_limit_charge's, on api_rate_limit_keys' primary key (key).
        cursor.execute(
            "INSERT INTO api_rate_limit_keys AS w (key, window_start, count)"
            " VALUES (%s, date_bin(make_interval(secs => %s), now(), timestamptz 'epoch'), 1)"
            " ON CONFLICT (key) DO UPDATE SET"
            " count = CASE WHEN w.window_start = EXCLUDED.window_start THEN w.count + 1 ELSE 1 END,"
            " window_start = EXCLUDED.window_start"
            " RETURNING count, extract(epoch FROM w.window_start + make_interval(secs => %s) - now())",
            [key[:KEY_MAX], window, window],
        )
        count, seconds_left = cursor.fetchone()
    if count > limit:
        raise RateLimited(
            "rate_limited",
            f"Too many requests: at most {limit} per {window} s {what}. Retry after the Retry-After seconds.",
            retry_after=max(1, math.ceil(float(seconds_left))),
        )


def sweep_stale_windows(ctx: JobContext) -> StepResult:
    """Sweep step: keys whose last window began more than an hour ago (every window is at
    most an hour: settings), so a source address seen once does not stay a row for ever."""
    return delete_in_rounds(ctx, _delete_stale_windows, page=SWEEP_PAGE, rounds=MAX_SWEEP_PAGES)


def _delete_stale_windows(page: int) -> int:
    with connection.cursor() as cursor:
        # A page of stale keys. No index on window_start, on purpose: it changes every
        # window, and an index on it would make each request's update non-HOT; the
        # table holds one row per key seen within about an hour, so the hourly scan is
        # short. The age is repeated outside: a key counted again meanwhile stays.
        cursor.execute(
            "DELETE FROM api_rate_limit_keys WHERE key IN (SELECT key FROM api_rate_limit_keys"
            " WHERE window_start < now() - interval '1 hour' LIMIT %s)"
            " AND window_start < now() - interval '1 hour'",
            [page],
        )
        return cursor.rowcount
