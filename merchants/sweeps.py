"""Sweep steps (``sweep_expired``): assertion ``jti``s and access tokens past their expiry.

Both delete the head of their table page by page, oldest first, each page its own
statement; what they retired is gone, so they need no cursor. Expiry is the database clock's.
"""

from __future__ import annotations

from django.db import connection

from jobs.maintenance.housekeeping import StepResult, delete_in_rounds
from jobs.runner.context import JobContext

SWEEP_PAGE = 1000
MAX_SWEEP_PAGES = 50


def _sweep(ctx: JobContext, table: str) -> StepResult:
    def delete_page(page: int) -> int:
        with connection.cursor() as cursor:
            # A page of the oldest expired rows (index <table>_expires on expires_at). The guard is repeated on the
            # outer DELETE: a jti reused after its expiry is re-stored in place
            # (clients._record_jti's ON CONFLICT DO UPDATE), and a DELETE that picked the row
            # while it was expired re-checks only its own WHERE on the new row version.
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table}"
                " WHERE expires_at <= now() ORDER BY expires_at LIMIT %s) AND expires_at <= now()",
                [page],
            )
            return cursor.rowcount

    return delete_in_rounds(ctx, delete_page, page=SWEEP_PAGE, rounds=MAX_SWEEP_PAGES)


def sweep_expired_jtis(ctx: JobContext) -> StepResult:
    """Sweep step: assertion jtis whose assertion can no longer be presented."""
    return _sweep(ctx, "oauth_assertion_jtis")


def sweep_expired_access_tokens(ctx: JobContext) -> StepResult:
    """Sweep step: bearer tokens past their expiry (they already stopped authenticating)."""
    return _sweep(ctx, "oauth_access_tokens")
