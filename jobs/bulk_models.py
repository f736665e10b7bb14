"""Bulk operations: an operator's "do this to everything matching a filter", submitted in
O(1) rows and expanded by the queue (``jobs.primitives.expansion``).

Submit writes the envelope (:class:`BulkOperation`) and one ``bulk_expand`` job, whatever
the number of matches. The expansion pages through the matches and writes one
:class:`BulkItem` per match together with its ``bulk_item`` unit; the item row is the
durable name that makes a re-run create nothing twice (a unit's ``jobs.dedupe_key`` is
only unique while the unit is live).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class BulkOperationKind(models.TextChoices):
    """The closed set of bulk operations; each is registered in ``jobs.primitives.expansion``."""

    REPLAY_DEAD_LETTERS = "replay_dead_letters", "Replay pending dead letters matching a filter"
    RESEND_DELIVERIES = "resend_deliveries", "Resend webhook deliveries that failed in a window"


class BulkOperationState(models.TextChoices):
    EXPANDING = "expanding", "Expanding"
    """Its expansion is still creating per-item units (some may already be done)."""
    RUNNING = "running", "Running"
    """Every unit exists; some have not finished."""
    DONE = "done", "Done"
    """Every unit finished (each done or refused, with the reason on its item)."""
    FAILED = "failed", "Failed"
    """The expansion could not run at all (``error`` says why); nothing more will happen."""
    CANCELLING = "cancelling", "Cancelling"
    """An operator cancelled (or discarded) its expansion: no more units are created; those
    created and not yet run are skipped, those in flight finish with their real outcome."""
    CANCELLED = "cancelled", "Cancelled"
    """Cancelled, and every unit it had created has ended (``error`` says who and why)."""


FINISHED_STATES = (BulkOperationState.DONE, BulkOperationState.FAILED, BulkOperationState.CANCELLED)


class BulkOperation(models.Model):
    """The envelope: what was asked, by whom, and how far it got."""

    operation = models.CharField(max_length=32, choices=BulkOperationKind.choices)
    filter = models.JSONField(default=dict, help_text="The selection, as the operation's pager reads it.")
    options = models.JSONField(default=dict, help_text="How each item is acted on (e.g. force).")
    requested_by = models.CharField(max_length=150)
    # The Django user acting, when one did: its admin log entries (History) are written per item.
    user_id = models.IntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, db_default="")
    state = models.CharField(max_length=16, choices=BulkOperationState.choices, db_default=BulkOperationState.EXPANDING)
    matched = models.IntegerField(db_default=0, help_text="Items the expansion found (each recorded once).")
    created = models.IntegerField(db_default=0, help_text="Per-item units the expansion enqueued.")
    done = models.IntegerField(db_default=0, help_text="Units that finished with their effect.")
    refused = models.IntegerField(db_default=0, help_text="Units the single-item service refused (why: on the item).")
    failed = models.IntegerField(
        db_default=0, help_text="Units dead-lettered (the letter on the item); a replay of the letter moves it."
    )
    skipped = models.IntegerField(db_default=0, help_text="Units not run: the operation, or the unit, was cancelled.")
    # The keyset checkpoint: the last item id expanded, committed with its page.
    cursor = models.BigIntegerField(db_default=0)
    error = models.TextField(blank=True, db_default="")
    # The statement's instant (not the transaction's): what the operation matches is bounded
    # by it, and rows written earlier in the submitting transaction are before it.
    created_at = models.DateTimeField(db_default=Now())
    expanded_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "bulk_operations"
        ordering = ("-id",)
        constraints = [
            models.CheckConstraint(
                condition=Q(operation__in=BulkOperationKind.values), name="bulk_operations_operation_known"
            ),
            models.CheckConstraint(
                condition=Q(state__in=BulkOperationState.values), name="bulk_operations_state_known"
            ),
            models.CheckConstraint(
                condition=Q(
                    done__gte=0,
                    refused__gte=0,
                    failed__gte=0,
                    skipped__gte=0,
                    created__gte=models.F("done") + models.F("refused") + models.F("failed") + models.F("skipped"),
                ),
                name="bulk_operations_counts_consistent",
            ),
            models.CheckConstraint(condition=~Q(requested_by=""), name="bulk_operations_requested_by_set"),
        ]

    def __str__(self) -> str:
        return f"bulk operation {self.pk} ({self.operation}, {self.state})"


class BulkItemState(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    REFUSED = "refused"
    FAILED = "failed"
    """Its unit was dead-lettered (the note names the letter); replaying the letter acts again."""
    SKIPPED = "skipped"
    """The operation, or the unit itself, was cancelled before the unit ran."""


class BulkItem(models.Model):
    """One match of a bulk operation: its durable name and its outcome."""

    operation = models.ForeignKey(BulkOperation, on_delete=models.CASCADE, related_name="items")
    item_id = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=BulkItemState.choices, db_default=BulkItemState.PENDING)
    note = models.TextField(blank=True, db_default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "bulk_items"
        constraints = [
            # The name of a unit: the expansion's ON CONFLICT DO NOTHING leans on it.
            models.UniqueConstraint(fields=["operation", "item_id"], name="bulk_items_operation_item"),
            models.CheckConstraint(condition=Q(state__in=BulkItemState.values), name="bulk_items_state_known"),
        ]

    def __str__(self) -> str:
        return f"item {self.item_id} of bulk operation {self.operation_id}"
