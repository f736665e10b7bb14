"""The two statements every money object of ``charges`` shares (charges, refunds, and the
capture phase of a charge): the guarded status write, and the backstop's page of live rows
whose poll is not awaiting a human."""

from __future__ import annotations

from django.db import connection
from django.db.models.functions import Now


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


def cas(model, pk: str, sources, **changes) -> bool:
    """Move the row ``pk`` only from one of ``sources`` (the compare-and-swap every status
    write is); whether it matched. False means somebody else moved it first."""
    return model.objects.filter(pk=pk, status__in=[str(s) for s in sources]).update(**changes, updated_at=Now()) == 1


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


def live_page(table: str, live, *, prefix: str, kind: str, after: str, limit: int) -> list[tuple[str, str]]:
    """Rows of ``table`` (a constant of the caller's, never input) in a ``live`` status with
    ids after ``after`` whose poll (dedupe key ``prefix`` + id, job ``kind``) is not awaiting
    a human's review: (id, merchant id) pairs, by id."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LIVE_PAGE.format(table=table, live=", ".join(f"'{s}'" for s in sorted(str(s) for s in live))),
            {
                "after": after,
                "limit": limit,
                "prefix": prefix,
                "kind": kind,
            },
        )
        return cursor.fetchall()
