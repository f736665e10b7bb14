"""The admin overview page (``<admin>/overview/``): the last hour, drawn as charts.

Read in one transaction, so every chart shares one snapshot and one database ``now()``.
Needs staff and ``jobs.view_job`` (it shows counts only: no payload, URL path or secret).
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.template.response import TemplateResponse

from jobs.operator.durations import humanize_seconds
from vpay.overview import charts, sql

REFRESH_SECONDS = 60
PERMISSION = "jobs.view_job"


def overview_data() -> dict:
    """Everything the page shows, read in one snapshot."""
    with transaction.atomic():
        return {
            "queue": sql.queue_by_kind(),
            "attempts": sql.attempts_by_bucket(),
            "failing": sql.failing_endpoints(),
            "unresolved": sql.unresolved_charges(),
            "pending_by_kind": sql.dead_letters_pending_by_kind(),
            "new_letters": sql.new_dead_letters_by_bucket(),
            "now": sql.database_now(),
        }


def overview_context(data: dict) -> dict:
    queue, attempts = data["queue"], data["attempts"]
    width = sql.BUCKET_SECONDS
    return {
        "drawn_at": data["now"],
        "refresh_seconds": REFRESH_SECONDS,
        "totals": {
            "claimable": sum(k.claimable for k in queue),
            "scheduled": sum(k.scheduled for k in queue),
            "leased": sum(k.leased for k in queue),
            "oldest": humanize_seconds(max((k.oldest_claimable_seconds for k in queue), default=0.0)),
            "succeeded": sum(ok for ok, _ in attempts),
            "failed": sum(failed for _, failed in attempts),
            "failing_endpoints": len(data["failing"]),
            "unresolved": sum(r.unresolved for r in data["unresolved"]),
            "unresolved_new": sum(r.new_in_window for r in data["unresolved"]),
            "pending": sum(n for _, n in data["pending_by_kind"]),
            "pending_new": sum(data["new_letters"]),
        },
        "depth_chart": charts.bar_chart(
            [(k.kind, [k.claimable, k.scheduled, k.leased], f"{k.claimable + k.scheduled + k.leased}") for k in queue],
            [("claimable", charts.AMBER), ("scheduled", charts.GREY), ("leased", charts.BLUE)],
        ),
        "age_chart": charts.bar_chart(
            [(k.kind, [k.oldest_claimable_seconds], humanize_seconds(k.oldest_claimable_seconds)) for k in queue],
            [("oldest claimable", charts.RED)],
        ),
        "attempts_chart": charts.column_chart(
            [[ok, failed] for ok, failed in attempts],
            [("succeeded", charts.GREEN), ("failed", charts.RED)],
            bucket_seconds=width,
        ),
        "failing_chart": charts.bar_chart(
            [(f"{e.endpoint_id} ({e.host})", [e.failures], f"{e.failures}") for e in data["failing"]],
            [("failed attempts", charts.RED)],
            label_width=300,
        ),
        "unresolved_chart": charts.bar_chart(
            [
                (r.rail, [r.unresolved], f"{r.unresolved} (oldest {humanize_seconds(r.oldest_seconds)})")
                for r in data["unresolved"]
            ],
            [("unresolved", charts.AMBER)],
            text_width=150,
        ),
        "pending_chart": charts.bar_chart(
            [(kind, [n], str(n)) for kind, n in data["pending_by_kind"]], [("pending review", charts.RED)]
        ),
        "new_letters_chart": charts.column_chart(
            [[n] for n in data["new_letters"]], [("new, still pending", charts.RED)], bucket_seconds=width
        ),
    }


def overview(request):
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    context = {
        **admin.site.each_context(request),
        "title": "Overview: the last hour",
        **overview_context(overview_data()),
    }
    return TemplateResponse(request, "admin/overview.html", context)
