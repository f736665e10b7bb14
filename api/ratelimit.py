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
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import connection

from vpay.errors import RateLimited


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
