"""Expansion: a bulk operation submitted in O(1) rows becomes its per-item units on the queue.

Submit (``jobs.services.bulk``) writes the envelope and one ``bulk_expand`` job. That job
pages through the operation's matches by keyset (ids after the envelope's ``cursor``, in id
order), one page per transaction under the envelope's row lock, heartbeating between
pages. Each page records one ``bulk_items`` row per match and enqueues a ``bulk_item`` unit
for each row that was new, and moves the cursor, all in one statement
(``jobs.primitives.bulk_sql``): a crash mid-page rolls the page back whole, a crash between pages
resumes from the cursor, and a re-run over expanded ids (a lost cursor) creates nothing.

A ``bulk_item`` unit is fenced: the single-item service (replay one dead letter, resend
one delivery), the item's outcome and the envelope's counters commit together with the
unit's fence row and its delete. The item's compare-and-swap makes a redelivered unit a
no-op even after its fence row expired.

Operations register here with :func:`register_operation` (apps from their ``ready()``:
``jobs`` imports no app). An operation is its pager (SQL) and its per-item act.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from jobs import registry
from jobs.bulk_models import BulkItemState, BulkOperationKind, BulkOperationState
from jobs.kinds import JobKind
from jobs.primitives import bulk_sql
from jobs.primitives.retry import RetryPolicy
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome

logger = logging.getLogger("jobs.primitives.expansion")


class BulkRefused(ValueError):
    """A bulk operation could not be submitted (bad filter, unknown operation): nothing written."""


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    done: bool
    note: str = ""


@dataclass(frozen=True)
class BulkOp:
    """One kind of bulk operation.

    ``page_sql`` selects ``id`` of the next matches: ``id > %(cursor)s``, ``ORDER BY id
    LIMIT %(limit)s``, with ``%(op)s`` the envelope's id (join ``bulk_operations`` to anchor
    relative windows on its ``created_at``, the database clock at submit) and the names
    ``params`` returns. ``params`` turns a stored filter into those names and raises
    :class:`BulkRefused` on one it cannot read (also the submit's validation).
    ``apply`` acts on one item with the single-item service, inside the unit's transaction.
    ``preview_sql`` counts what the same filter matches now, for a confirmation page: one
    row (matches, window start, window end) with the window drawn on the database clock
    (the names ``params`` returns; no ``op``, no cursor).
    """

    operation: BulkOperationKind
    page_sql: str
    params: Callable[[dict], dict]
    apply: Callable[[int, bulk_sql.Envelope], ItemOutcome]
    preview_sql: str


_OPERATIONS: dict[str, BulkOp] = {}


def register_operation(op: BulkOp) -> BulkOp:
    if op.operation.value in _OPERATIONS:
        raise RuntimeError(f"bulk operation {op.operation.value!r} is already registered")
    _OPERATIONS[op.operation.value] = op
    return op


def operation(name: str) -> BulkOp | None:
    return _OPERATIONS.get(name)


def registered_operations() -> set[str]:
    return set(_OPERATIONS)


def page_size() -> int:
    return settings.VPAY_BULK_PAGE_SIZE


# A page is a short transaction: a retry resumes from the cursor, so the policy only needs
# to outlast a database restart.
EXPAND_RETRY = RetryPolicy(max_attempts=10, base_seconds=2.0, cap_seconds=120.0)


@registry.register(
    JobKind.BULK_EXPAND,
    schema=PayloadSchema(required={"operation_id": "int"}),
    timeout_seconds=900.0,
    retry=EXPAND_RETRY,
)
def expand(ctx: JobContext) -> Outcome:
    """Page through the operation's matches until a short page; each page commits on its own."""
    operation_id = ctx.payload["operation_id"]
    item_spec = registry.get(JobKind.BULK_ITEM.value)
    assert item_spec is not None  # registered in this module
    max_attempts = registry.retry_policy(item_spec).max_attempts
    limit = page_size()
    while True:
        with transaction.atomic():
            env = bulk_sql.envelope(operation_id, lock=True)
            if env is None or env.state != BulkOperationState.EXPANDING:
                return Outcome.done()  # gone, or a re-run of an expansion that finished
            op = operation(env.operation)
            try:
                if op is None:
                    raise BulkRefused(f"bulk operation {env.operation!r} has no registered handler")
                params = op.params(env.filter)
            except BulkRefused as exc:
                bulk_sql.mark_failed(operation_id, str(exc))
                logger.error("bulk operation failed", extra={"operation_id": operation_id, "error": str(exc)})
                return Outcome.done()
            seen, _created, _cursor = bulk_sql.expand_page(
                op.page_sql,
                params,
                op=operation_id,
                cursor=env.cursor,
                limit=limit,
                queue=settings.VPAY_BULK_QUEUE,
                max_attempts=max_attempts,
            )
            if seen < limit:
                state = bulk_sql.mark_expanded(operation_id)
                logger.info("bulk operation expanded", extra={"operation_id": operation_id, "state": state})
                return Outcome.done()
        ctx.heartbeat()  # between pages: the lease lives, a cancel or the timeout stops here


@registry.register(
    JobKind.BULK_ITEM,
    schema=PayloadSchema(required={"operation_id": "int", "item_id": "int"}),
    timeout_seconds=60.0,
    fenced=True,
    subject=lambda payload: f"bulk:{payload['operation_id']}:{payload['item_id']}",
)
def act_on_item(ctx: JobContext) -> Outcome:
    """One item: the single-item service, its outcome and the counters, in the loop's transaction."""
    operation_id, item_id = ctx.payload["operation_id"], ctx.payload["item_id"]
    was = bulk_sql.item_state(operation_id, item_id)
    if was not in bulk_sql.ACTIONABLE:
        return Outcome.done()  # ended already (a redelivery), or the operation is gone
    env = bulk_sql.envelope(operation_id)
    assert env is not None  # the item's row is locked above, and an operation is deleted only with its items
    if was == BulkItemState.PENDING and env.state in (BulkOperationState.CANCELLING, BulkOperationState.CANCELLED):
        note = "the operation was cancelled before this item ran"
        bulk_sql.finish_item(operation_id, item_id, state=BulkItemState.SKIPPED, was=was, note=note)
        return Outcome.done()
    op = operation(env.operation)
    if op is None:
        outcome = ItemOutcome(False, f"bulk operation {env.operation!r} has no registered handler")
    else:
        outcome = op.apply(item_id, env)
    state = BulkItemState.DONE if outcome.done else BulkItemState.REFUSED
    bulk_sql.finish_item(operation_id, item_id, state=state, was=was, note=outcome.note)
    return Outcome.done()
