"""Bulk operations in the ops console: the list, and each one's page with its progress.

Submitting is on the pages of what they act on (``jobs.admin.bulk_replay`` from the dead
letters, ``webhooks.admin_bulk`` from the deliveries) and in the shell; an operator lands
here after a submit. While an operation is not finished its page reloads itself every few
seconds (a ``<meta http-equiv="refresh">``: no script), showing the state and the counts.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.text import Truncator

from jobs.admin.base import EXCERPT, ReadOnlyAdmin
from jobs.bulk_models import FINISHED_STATES, BulkItem, BulkItemState, BulkOperation

REFRESH_SECONDS = 2
REFUSALS_SHOWN = 20


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "operation",
        "state",
        "matched",
        "created",
        "done",
        "refused",
        "failed",
        "skipped",
        "requested_by",
        "reason_excerpt",
        "created_at",
    )
    list_filter = ("state", "operation")
    ordering = ("-id",)
    change_form_template = "admin/jobs/bulkoperation/change_form.html"
    fields = (
        "id",
        "operation",
        "state",
        "filter",
        "options",
        "requested_by",
        "reason",
        "matched",
        "created",
        "done",
        "refused",
        "failed",
        "skipped",
        "cursor",
        "error",
        "created_at",
        "expanded_at",
        "finished_at",
    )
    readonly_fields = fields

    @admin.display(description="reason")
    def reason_excerpt(self, obj):
        return Truncator(obj.reason or "").chars(EXCERPT)

    def render_change_form(self, request, context, *args, **kwargs):
        obj = context.get("original")
        if obj is not None:
            context.update(progress_context(obj))
        return super().render_change_form(request, context, *args, **kwargs)


def progress_context(op: BulkOperation) -> dict:
    """The progress panel: where the operation is, the share finished, the first refusals
    and the first dead-lettered units."""
    finished = op.done + op.refused + op.failed + op.skipped
    ended = op.state in FINISHED_STATES
    return {
        "progress": {
            "finished": ended,
            "refresh_seconds": REFRESH_SECONDS,
            "percent": 100 if ended else (100 * finished // op.created if op.created else 0),
            "pending": op.created - finished,
            "refusals": _first(op, BulkItemState.REFUSED),
            "more_refusals": max(op.refused - REFUSALS_SHOWN, 0),
            "failures": _first(op, BulkItemState.FAILED),
            "more_failures": max(op.failed - REFUSALS_SHOWN, 0),
            "list_url": reverse("admin:jobs_bulkoperation_changelist"),
        }
    }


def _first(op: BulkOperation, state: str) -> list[tuple[int, str]]:
    return list(
        BulkItem.objects.filter(operation_id=op.pk, state=state)
        .order_by("item_id")
        .values_list("item_id", "note")[:REFUSALS_SHOWN]
    )
