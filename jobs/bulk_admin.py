"""Bulk operations in the ops console: a read-only list with their state and counts
(``expanding`` included); submitting is the shell's for now (docs/ops-console.md)."""

from __future__ import annotations

from django.contrib import admin

from jobs.admin import ReadOnlyAdmin
from jobs.bulk_models import BulkOperation


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    list_display = ("id", "operation", "state", "matched", "created", "done", "refused", "requested_by", "created_at")
    list_filter = ("state", "operation")
    ordering = ("-id",)
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
        "cursor",
        "error",
        "created_at",
        "expanded_at",
        "finished_at",
    )
    readonly_fields = fields
