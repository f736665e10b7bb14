"""Live jobs in the ops console: depth by queue and kind above the list, and cancel (a reason
page, then ``jobs.services.cancels.job_cancel`` one job per transaction); the fence's rows."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Case, CharField, Value, When
from django.utils.text import Truncator

from jobs import registry
from jobs.admin.base import EXCERPT, ReadOnlyAdmin
from jobs.models import Job, ProcessedJob, TransactionNow
from jobs.operator.durations import humanize_seconds
from jobs.services import cancels
from jobs.storage.health_sql import queue_summary


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "queue", "tenant", "status", "run_at", "attempts", "locked_by", "error_excerpt")
    list_filter = ("kind", "queue")
    search_fields = ("=job_id", "=correlation_id", "=dedupe_key")
    search_help_text = "Exact job_id, correlation id or dedupe key."
    ordering = ("run_at",)
    actions = ["cancel_selected"]
    change_list_template = "admin/jobs/job/change_list.html"

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                status_sql=Case(
                    When(locked_at__isnull=False, cancel_requested_at__isnull=False, then=Value("cancelling")),
                    When(locked_at__isnull=False, then=Value("leased")),
                    When(run_at__lte=TransactionNow(), then=Value("claimable")),
                    default=Value("scheduled"),
                    output_field=CharField(),
                )
            )
        )

    @admin.display(description="status", ordering="locked_at")
    def status(self, obj):
        return getattr(obj, "status_sql", "")

    @admin.display(description="last error")
    def error_excerpt(self, obj):
        return Truncator((obj.last_error or "").strip()).chars(EXCERPT)

    def changelist_view(self, request, extra_context=None):
        summary = queue_summary()
        totals = {
            "claimable": sum(r.claimable for r in summary),
            "scheduled": sum(r.scheduled for r in summary),
            "leased": sum(r.leased for r in summary),
            "oldest": humanize_seconds(max((r.oldest_claimable_seconds for r in summary), default=0.0)),
        }
        rows = [(r, humanize_seconds(r.oldest_claimable_seconds) if r.claimable else "-") for r in summary]
        return super().changelist_view(
            request, {**(extra_context or {}), "queue_summary": rows, "queue_totals": totals}
        )

    def has_cancel_permission(self, request):
        return request.user.has_perm("jobs.cancel_job")

    @admin.action(description="Cancel selected jobs…", permissions=["cancel"])
    def cancel_selected(self, request, queryset):
        jobs = list(queryset.order_by("id"))
        actor, user_id = request.user.get_username(), request.user.pk

        def cancel(reason: str, _options: dict) -> None:
            for job in jobs:  # one transaction each; one message each, saying what happened
                try:
                    done = cancels.job_cancel(job_pk=job.pk, actor=actor, reason=reason, user_id=user_id)
                except cancels.CancelRefused as refused:
                    messages.warning(request, f"Refused: {refused}.")
                else:
                    messages.success(request, f"Job #{job.pk}: {done.message}.")

        return self._act_with_reason(
            request,
            jobs,
            act=cancel,
            reason_required="A reason is required to cancel: it is recorded with the cancel.",
            template="admin/jobs/job/cancel_form.html",
            title="Cancel jobs",
            jobs=jobs,
            leased=sum(1 for job in jobs if job.locked_at is not None),
            not_cancellable=sorted({job.kind for job in jobs if _not_cancellable(job.kind)}),
        )


def _not_cancellable(kind: str) -> bool:
    spec = registry.get(kind)
    return spec is not None and not spec.cancellable


@admin.register(ProcessedJob)
class ProcessedJobAdmin(ReadOnlyAdmin):
    list_display = ("job_id", "kind", "subject", "processed_at", "expires_at")
    search_fields = ("=job_id",)
    ordering = ("-processed_at",)
