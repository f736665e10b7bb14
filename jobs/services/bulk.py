"""Submitting and reading bulk operations (the admin and the shell call these).

Submit is O(1) in items: one envelope row and one expansion job, in one transaction,
whatever the filter matches; ``jobs.primitives.expansion`` does the rest on the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from jobs.adapters import postgres as queue
from jobs.bulk_models import FINISHED_STATES, BulkOperation
from jobs.kinds import JobKind
from jobs.primitives import bulk_sql, expansion
from jobs.primitives.expansion import BulkRefused

__all__ = [
    "BulkRefused",
    "Progress",
    "bulk_operation_preview",
    "bulk_operation_progress",
    "bulk_operation_submit",
]


def bulk_operation_submit(
    *,
    operation: str,
    filter: dict,
    actor: str,
    options: dict | None = None,
    reason: str = "",
    user_id: int | None = None,
) -> int:
    """Write the envelope and its expansion job; the operation's id. Raises
    :class:`BulkRefused` (nothing written) for an unknown operation or an unreadable filter."""
    op = expansion.operation(operation)
    if op is None:
        raise BulkRefused(f"unknown bulk operation {operation!r}")
    op.params(filter)  # refuses a filter the expansion could not read, before anything is written
    actor = (actor or "").strip()[:150]
    if not actor:
        raise BulkRefused("a bulk operation needs an actor (who asked)")
    with transaction.atomic():
        envelope = BulkOperation.objects.create(
            operation=operation,
            filter=filter,
            options=options or {},
            requested_by=actor,
            user_id=user_id,
            reason=(reason or "").strip()[:2000],
        )
        queue.enqueue(
            JobKind.BULK_EXPAND,
            {"operation_id": envelope.pk},
            dedupe_key=f"bulk:{envelope.pk}:expand",
            queue=settings.VPAY_BULK_QUEUE,
            tenant=f"bulk:{envelope.pk}",
            # Ahead of its own units (same tenant): a re-run after a crash expands on first.
            priority=-10,
        )
    return envelope.pk


@dataclass(frozen=True, slots=True)
class Progress:
    id: int
    operation: str
    state: str
    matched: int
    created: int
    done: int
    refused: int
    error: str
    failed: int = 0
    skipped: int = 0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def line(self) -> str:
        text = (
            f"bulk operation #{self.id} {self.operation}: {self.state}; matched {self.matched}, "
            f"created {self.created}, done {self.done}, refused {self.refused}"
        )
        # Only when there are any: the line an operator knows stays the same otherwise.
        text += f", failed {self.failed}" if self.failed else ""
        text += f", skipped {self.skipped}" if self.skipped else ""
        return text + (f"; error: {self.error}" if self.error else "")


def bulk_operation_progress(operation_id: int) -> Progress | None:
    row = (
        BulkOperation.objects.filter(pk=operation_id)
        .values_list("id", "operation", "state", "matched", "created", "done", "refused", "error", "failed", "skipped")
        .first()
    )
    return Progress(*row) if row else None


def bulk_operation_preview(*, operation: str, filter: dict) -> bulk_sql.Preview:
    """What ``filter`` matches now and the window it is drawn on (the database clock), for a
    confirmation page; writes nothing. Raises :class:`BulkRefused` as a submit would, and
    for a window that is empty on the database clock (its start not before its end)."""
    op = expansion.operation(operation)
    if op is None:
        raise BulkRefused(f"unknown bulk operation {operation!r}")
    found = bulk_sql.preview(op.preview_sql, op.params(filter))
    if found.window_start is not None and found.window_start >= found.window_end:
        raise BulkRefused("the window is empty: its start is not before its end")
    return found
