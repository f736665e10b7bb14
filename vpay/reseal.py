"""Re-seal every sealed value in place: under the first (current) key, in the bound format.

Run after a new key is put first in ``VPAY_SECRETS_KEY`` (so the old key can be dropped)
and once after upgrading to the bound format (so ``VPAY_SEALED_READ_FERNET`` can be turned
off). Each value is opened for its own row and sealed again for it; a value no configured
key opens for its row is counted and left as it is. Safe to run while vpay serves: a page
of rows at a time, each row written only if it still holds what was read.
"""

from __future__ import annotations

from typing import NamedTuple

from django.db import connection

from vpay import sealing

PAGE = 500


class Target(NamedTuple):
    table: str
    column: str
    identity: tuple[str, ...]  # the columns a value is bound to (vpay.sealing.Binding.row)
    binary: bool = False


TARGETS = [
    Target("charges", "pay_token", ("id",)),
    Target("charges", "redirect_url", ("id",)),
    Target("checkout_sessions", "client_secret", ("id",)),
    Target("api_idempotency_records", "body", ("merchant_id", "key"), binary=True),
    Target("webhook_secrets", "sealed", ("endpoint_id",)),  # bound to the endpoint (webhooks.sealing)
]


class Counts(NamedTuple):
    resealed: int
    unreadable: int


def _reseal(target: Target, value, binding: sealing.Binding):
    if target.binary:
        return sealing.reseal_bytes(bytes(value), binding)
    return sealing.reseal_bytes(value.encode("ascii"), binding).decode("ascii")


def reseal_target(target: Target, *, fernet_only: bool = False) -> Counts:
    """Every value of one column re-sealed (or only those of the earlier format)."""
    resealed = unreadable = 0
    after = None
    identity = ", ".join(target.identity)
    while True:
        with connection.cursor() as cursor:
            # The next page of rows holding a value, by primary key (its index).
            after_last = "" if after is None else "AND id > %s"
            cursor.execute(
                f"SELECT id, {identity}, {target.column} FROM {target.table}"
                f" WHERE {target.column} IS NOT NULL {after_last} ORDER BY id LIMIT %s",
                [PAGE] if after is None else [after, PAGE],
            )
            rows = cursor.fetchall()
        for row in rows:
            row_id, parts, value = row[0], row[1:-1], row[-1]
            raw = bytes(value) if target.binary else value.encode("ascii", "replace")
            if fernet_only and not sealing.is_fernet(raw):
                continue
            try:
                fresh = _reseal(target, value, sealing.bound(target.table, target.column, *parts))
            except (sealing.Unreadable, UnicodeError):
                unreadable += 1
                continue
            with connection.cursor() as cursor:
                # One row by primary key, only if it still holds the value read (a concurrent
                # write of a fresh value wins).
                cursor.execute(
                    f"UPDATE {target.table} SET {target.column} = %s WHERE id = %s AND {target.column} = %s",
                    [fresh, row_id, value],
                )
                resealed += cursor.rowcount
        if len(rows) < PAGE:
            return Counts(resealed, unreadable)
        after = rows[-1][0]
