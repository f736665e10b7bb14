"""The statements every money object of ``charges`` shares (charges, refunds, and the
capture phase of a charge): the guarded status write, and the backstop's page of live rows
whose poll is not awaiting a human and its count of the polls it really restored."""

from __future__ import annotations

from django.db import connection
from django.db.models.functions import Now

from vpay.field_params import NOT_PLAIN, db_param
from vpay.pipelined import fetch_prepared


def lock_intent(intent_id: str, *, merchant_id: str | None = None):
    """The payment intent (the merchant's, when ``merchant_id`` is given), its row locked
    until the transaction ends (``SELECT … FOR UPDATE``, payment_intents_pkey), or None.
    The lock every change of its money takes: a confirm's (``repository.lock_for_confirm``),
    a refund's, a capture's, a cancel's, an authorization's expiry; so they serialize."""
    from charges.models import PaymentIntent

    if not connection.in_atomic_block:
        raise RuntimeError("lock_intent() holds a row lock: it must run inside a transaction")
    found = PaymentIntent.objects.select_for_update().filter(pk=intent_id)
    if merchant_id is not None:
        found = found.filter(merchant_id=merchant_id)
    return found.first()


# The compare-and-swap (cas, below) as one prepared statement per model and set of changed
# columns, built from the model's own metadata: by primary key, guarded on the status. A
# column given Now() is set to the statement's instant, as Django's Now() is on PostgreSQL.
# Prepared (vpay.pipelined): as a queryset's update() it cost the process the compile of
# the queryset and the server the planning of the statement at every call, on every
# confirm and settlement. By the table's primary key index (<table>_pkey).
_CAS = """
WITH moved AS (
    UPDATE {table} SET {assignments}, {updated_at} = statement_timestamp()
     WHERE {pk} = %(pk)s AND {status} = ANY(%(sources)s::text[])
    RETURNING 1
)
SELECT count(*) FROM moved
"""
_CAS_SQL: dict[tuple, str] = {}


def cas(model, pk: str, sources, **changes) -> bool:
    """Move the row ``pk`` only from one of ``sources`` (the compare-and-swap every status
    write is); whether it matched. False means somebody else moved it first."""
    if not changes:
        raise ValueError("a compare-and-swap must change something")
    columns: list[tuple[str, bool]] = []  # (column, set to the statement's instant)
    params: dict[str, object] = {"pk": pk, "sources": [str(s) for s in sources]}
    for name, value in changes.items():
        field = model._meta.get_field(name)
        if isinstance(value, Now):
            columns.append((field.column, True))
            continue
        # Prepared as update() prepares it; another expression, a model instance (update()
        # writes its primary key) or a value of another type goes through the queryset.
        db_value = db_param(field, value, connection)
        if db_value is NOT_PLAIN:
            return model.objects.filter(pk=pk, status__in=params["sources"]).update(**changes, updated_at=Now()) == 1
        params[f"v{len(columns)}"] = db_value
        columns.append((field.column, False))
    key = (model._meta.label, tuple(columns))
    sql = _CAS_SQL.get(key)
    if sql is None:
        quote, meta = connection.ops.quote_name, model._meta
        assignments = ", ".join(
            f"{quote(column)} = statement_timestamp()" if now else f"{quote(column)} = %(v{i})s"
            for i, (column, now) in enumerate(columns)
        )
        sql = _CAS_SQL[key] = _CAS.format(
            table=quote(meta.db_table),
            assignments=assignments,
            updated_at=quote(meta.get_field("updated_at").column),
            pk=quote(meta.pk.column),
            status=quote(meta.get_field("status").column),
        )
    return fetch_prepared(sql, params)[0][0] == 1


# Live rows of ``table`` after ``after`` by id (its partial index on the live statuses, by
# id; the statuses are spelled as literals, as the index's predicate is, so the planner
# can prove it), leaving out one whose poll is a dead letter awaiting review: the letter (and its
# alert) is the human's to replay or discard, and re-enqueueing it would go round the loop
# poll -> dead letter -> backstop -> poll once a pass. NOT IN over a non-NULL column is
# planned as one hashed subplan per statement (the letters awaiting review are few).
_LIVE_PAGE = """
SELECT id, merchant_id FROM {table}
 WHERE status IN ({live}) AND id > %(after)s
   AND (%(prefix)s::text || id) NOT IN (
       SELECT d.dedupe_key FROM dead_letters d
        WHERE d.state = 'pending_review' AND d.kind = %(kind)s AND d.dedupe_key IS NOT NULL
   )
 ORDER BY id
 LIMIT %(limit)s
"""


def _literals(statuses) -> str:
    """The statuses as SQL literals, as the partial indexes' predicates spell them."""
    return ", ".join(f"'{s}'" for s in sorted(str(s) for s in statuses))


def live_page(table: str, live, *, prefix: str, kind: str, after: str, limit: int) -> list[tuple[str, str]]:
    """Rows of ``table`` (a constant of the caller's, never input) in a ``live`` status with
    ids after ``after`` whose poll (dedupe key ``prefix`` + id, job ``kind``) is not awaiting
    a human's review: (id, merchant id) pairs, by id."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LIVE_PAGE.format(table=table, live=_literals(live)),
            {
                "after": after,
                "limit": limit,
                "prefix": prefix,
                "kind": kind,
            },
        )
        return cursor.fetchall()


# Of the polls this transaction just inserted for ``ids`` (their jobs' created_at is the
# transaction's start: the column's default), those whose row is still live: the backstop's
# count of polls that were lost. A row settled between the page's read and the insert had its
# poll finish in that window, so the insert found no conflict; its new poll finds it settled
# and ends, and it is no loss to report. By the primary key of {table} and the jobs' unique
# dedupe key (jobs_job_dedupe_key_unique).
_RESTORED_LIVE = """
SELECT count(*) FROM {table} t
  JOIN jobs j ON j.dedupe_key = %(prefix)s::text || t.id
 WHERE t.id = ANY(%(ids)s) AND t.status IN ({live})
   AND j.kind = %(kind)s AND j.created_at = transaction_timestamp()
"""


def restored_live(table: str, live, *, prefix: str, kind: str, ids: list[str]) -> int:
    """How many of ``ids`` (rows of ``table``, a constant of the caller's) are still live and
    got their poll from this transaction: see ``_RESTORED_LIVE``."""
    if not connection.in_atomic_block:
        raise RuntimeError("restored_live() counts this transaction's inserts: it must run inside one")
    with connection.cursor() as cursor:
        cursor.execute(
            _RESTORED_LIVE.format(table=table, live=_literals(live)),
            {"prefix": prefix, "kind": kind, "ids": ids},
        )
        return cursor.fetchone()[0]
