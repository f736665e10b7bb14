"""The ops console: dead letters (replay, discard), live jobs (depth, cancel), the fence.

Read-only everywhere except the actions. Every action is a two-step POST in the shape of
Django's ``delete_selected`` (a confirmation or reason page re-posting the selected ids,
then the act), gated by a custom permission, and done by :mod:`jobs.services.dead_letters`,
which writes the admin log entry in the same transaction as the change. Ages are computed
by PostgreSQL, never from the web process's clock.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.db.models import Case, CharField, DurationField, F, Value, When
from django.db.models.expressions import ExpressionWrapper
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from jobs import fence, registry
from jobs.durations import humanize_seconds
from jobs.health_sql import queue_summary
from jobs.models import (
    Alert,
    Breaker,
    BreakerState,
    DeadLetter,
    DeadLetterState,
    Job,
    ProcessedJob,
    TransactionNow,
    db_ago,
)
from jobs.services import cancels
from jobs.services import dead_letters as ops

EXCERPT = 80


class ReadOnlyAdmin(admin.ModelAdmin):
    show_full_result_count = False  # count(*) on a big queue table is not free

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _action_context(self, request, items, **extra):
        """The context every action page needs to re-post the selection (``delete_selected``'s)."""
        return {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "selected_ids": [obj.pk for obj in items],
            **extra,
        }

    def _act_with_reason(self, request, items, *, act, verb, noun, reason_required, template, **extra):
        """An action that records a reason: the reason form (400 with ``reason_required`` when
        a blank one was posted), then ``act(item, reason)`` for each item and one message each."""
        reason = request.POST.get("reason", "")
        error = ""
        if request.POST.get("post") == "yes":
            if ops.clean_reason(reason):
                _result_messages(request, [act(item, reason) for item in items], verb, noun)
                return None
            error = reason_required
        context = self._action_context(request, items, reason=reason, error=error, **extra)
        return TemplateResponse(request, template, context, status=400 if error else 200)


class CreatedWithinFilter(admin.SimpleListFilter):
    """Age buckets drawn on the database clock (Django's date filter uses the web host's)."""

    title = "created"
    parameter_name = "created"
    WINDOWS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}

    def lookups(self, request, model_admin):
        return [
            ("1h", "In the last hour"),
            ("24h", "In the last 24 hours"),
            ("7d", "In the last 7 days"),
            ("30d", "In the last 30 days"),
            ("past_horizon", "Older than the fence horizon"),
        ]

    def queryset(self, request, queryset):
        value = self.value()
        if value in self.WINDOWS:
            return queryset.filter(created_at__gte=db_ago(seconds=self.WINDOWS[value]))
        if value == "past_horizon":
            # The letter's own job_created_at; a replayed job's first enqueue may be older
            # still, which the replay itself checks (jobs.services.dead_letters).
            return queryset.filter(
                job_created_at__lte=db_ago(seconds=fence.ttl_seconds() - ops.REPLAY_FENCE_MARGIN_SECONDS)
            )
        return queryset


def _result_messages(request, results: list[ops.Result], verb: str, noun: str = "dead letter") -> None:
    done = [r for r in results if r.done]
    refused = [r for r in results if not r.done]
    if done:
        ids = ", ".join(f"#{r.id}" for r in done)
        messages.success(request, f"{verb} {len(done)} {noun}{'s' if len(done) != 1 else ''}: {ids}.")
    for r in refused:
        messages.warning(request, f"Refused: {noun} #{r.id} {r.message}.")


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "state",
        "kind",
        "queue",
        "attempts",
        "age",
        "error_excerpt",
        "correlation_id",
        "cause",
    )
    list_filter = ("state", "kind", "queue", "cause", CreatedWithinFilter)
    search_fields = ("=job_id", "=correlation_id")
    search_help_text = "Exact job_id or correlation id."
    date_hierarchy = "created_at"  # drill down by year, month, day (truncated in SQL)
    ordering = ("-created_at", "-id")
    actions = ["replay_selected", "discard_selected"]
    fieldsets = (
        (None, {"fields": ("state", "kind", "queue", "cause", "error_category", "attempts_of")}),
        ("Identity", {"fields": ("job_id", "correlation_id", "tenant", "dedupe_key", "priority")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Last error", {"fields": ("last_error_full",)}),
        ("History", {"fields": ("history", "related_letters")}),
    )

    # --- display ------------------------------------------------------------------------

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(age_interval=ExpressionWrapper(TransactionNow() - F("created_at"), output_field=DurationField()))
        )

    @admin.display(description="age", ordering="-created_at")
    def age(self, obj):
        interval = getattr(obj, "age_interval", None)
        return humanize_seconds(interval.total_seconds() if interval is not None else None)

    @admin.display(description="last error")
    def error_excerpt(self, obj):
        first_line = (obj.last_error or "").strip().splitlines()[0] if obj.last_error.strip() else ""
        return Truncator(first_line).chars(EXCERPT)

    @admin.display(description="attempts")
    def attempts_of(self, obj):
        return f"{obj.attempts} of {obj.max_attempts}"

    @admin.display(description="payload")
    def payload_pretty(self, obj):
        return format_html('<pre class="vpay-pre">{}</pre>', json.dumps(obj.payload, indent=2, sort_keys=True))

    @admin.display(description="last error")
    def last_error_full(self, obj):
        return format_html('<pre class="vpay-pre">{}</pre>', obj.last_error or "(none)")

    @admin.display(description="history")
    def history(self, obj):
        lines = [
            f"Created {obj.created_at:%Y-%m-%d %H:%M:%S %Z} (job first enqueued {obj.job_created_at:%Y-%m-%d %H:%M:%S %Z})"
        ]
        if obj.replayed_at:
            forced = " — forced past the fence horizon" if obj.replay_forced else ""
            lines.append(f"Replayed {obj.replayed_at:%Y-%m-%d %H:%M:%S %Z} by {obj.replayed_by}{forced}")
        if obj.discarded_at:
            lines.append(
                f"Discarded {obj.discarded_at:%Y-%m-%d %H:%M:%S %Z} by {obj.discarded_by}: {obj.discard_reason}"
            )
        return format_html('<pre class="vpay-pre">{}</pre>', "\n".join(lines))

    @admin.display(description="other dead letters of this job_id")
    def related_letters(self, obj):
        others = list(
            DeadLetter.objects.filter(job_id=obj.job_id)
            .exclude(pk=obj.pk)
            .order_by("created_at")
            .values_list("pk", "state")
        )
        if not others:
            return "none"
        return format_html_join(
            ", ",
            '<a href="{}">#{}</a> ({})',
            ((reverse("admin:jobs_deadletter_change", args=[pk]), pk, state) for pk, state in others),
        )

    def get_readonly_fields(self, request, obj=None):
        return [f for _, options in self.fieldsets for f in options["fields"]]

    # --- permissions --------------------------------------------------------------------

    def has_replay_permission(self, request):
        return request.user.has_perm("jobs.replay_deadletter")

    def has_discard_permission(self, request):
        return request.user.has_perm("jobs.discard_deadletter")

    def has_force_replay_permission(self, request):
        return request.user.has_perm("jobs.force_replay_deadletter")

    def render_change_form(self, request, context, *args, **kwargs):
        obj = context.get("original")
        pending = obj is not None and obj.state == DeadLetterState.PENDING_REVIEW
        context.update(
            can_replay=pending and self.has_replay_permission(request),
            can_discard=pending and self.has_discard_permission(request),
        )
        return super().render_change_form(request, context, *args, **kwargs)

    # --- actions ------------------------------------------------------------------------

    @admin.action(description="Replay selected dead letters…", permissions=["replay"])
    def replay_selected(self, request, queryset):
        letters = list(queryset.order_by("id"))
        if request.POST.get("post") == "yes":
            force = request.POST.get("force") == "on" and self.has_force_replay_permission(request)
            results = [
                ops.dead_letter_replay(
                    letter_id=letter.pk, actor=request.user.get_username(), force=force, user_id=request.user.pk
                )
                for letter in letters
            ]
            _result_messages(request, results, "Replayed")
            return None
        preview = ops.replay_preview([letter.pk for letter in letters])
        rows = [
            (
                letter,
                preview[letter.pk],
                ops.Result(letter.pk, False, preview[letter.pk]).message if preview[letter.pk] else "",
            )
            for letter in letters
        ]
        context = self._action_context(
            request,
            letters,
            title="Replay dead letters",
            rows=rows,
            replayable=sum(1 for _, refusal, _ in rows if refusal is None),
            past_horizon=sum(1 for _, refusal, _ in rows if refusal == ops.Refusal.PAST_FENCE_HORIZON),
            can_force=self.has_force_replay_permission(request),
            ttl_hours=round(fence.ttl_seconds() / 3600, 1),
        )
        return TemplateResponse(request, "admin/jobs/deadletter/replay_confirmation.html", context)

    @admin.action(description="Discard selected dead letters…", permissions=["discard"])
    def discard_selected(self, request, queryset):
        letters = list(queryset.order_by("id"))
        actor, user_id = request.user.get_username(), request.user.pk
        return self._act_with_reason(
            request,
            letters,
            act=lambda letter, reason: ops.dead_letter_discard(
                letter_id=letter.pk, actor=actor, reason=reason, user_id=user_id
            ),
            verb="Discarded",
            noun="dead letter",
            reason_required="A reason is required to discard: say why nobody needs to replay this.",
            template="admin/jobs/deadletter/discard_form.html",
            title="Discard dead letters",
            letters=letters,
            pending=sum(1 for letter in letters if letter.state == DeadLetterState.PENDING_REVIEW),
        )


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
        reason = request.POST.get("reason", "")
        if request.POST.get("post") == "yes" and ops.clean_reason(reason):
            for job in jobs:  # one transaction each; one message each, saying what happened
                try:
                    done = cancels.job_cancel(job_pk=job.pk, actor=actor, reason=reason, user_id=user_id)
                except cancels.CancelRefused as refused:
                    messages.warning(request, f"Refused: {refused}.")
                else:
                    messages.success(request, f"Job #{job.pk}: {done.message}.")
            return None
        return self._act_with_reason(
            request,
            jobs,
            act=None,  # a valid post was handled above
            verb="Cancelled",
            noun="job",
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


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "severity",
        "title",
        "source",
        "created_at",
        "logged_at",
        "sent_at",
        "send_attempts",
        "last_error",
    )
    list_filter = ("severity", "source")
    search_fields = ("=key",)
    ordering = ("-created_at", "-id")


@admin.register(Breaker)
class BreakerAdmin(ReadOnlyAdmin):
    """Every vendor breaker (``jobs.breakers``), open ones first. Read-only: a breaker moves
    only by its vendor's answers; an operator who wants a vendor tried again waits out the
    cool-down (the next call is the probe)."""

    list_display = ("name", "state", "failures", "open_for", "probe_in_flight", "error_excerpt", "updated_at")
    list_filter = ("state",)
    search_fields = ("name",)
    search_help_text = "Part of a name: rail:<code> or webhook_host:<host>."

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                # Computed by PostgreSQL: the web host's clock never measures an age.
                open_for_sql=ExpressionWrapper(TransactionNow() - F("opened_at"), output_field=DurationField()),
                state_rank=Case(
                    When(state=BreakerState.OPEN, then=Value(0)),
                    When(state=BreakerState.HALF_OPEN, then=Value(1)),
                    default=Value(2),
                ),
            )
            .order_by("state_rank", "name")
        )

    @admin.display(description="open for", ordering="opened_at")
    def open_for(self, obj):
        age = getattr(obj, "open_for_sql", None)
        if obj.state == BreakerState.CLOSED or age is None:
            return "-"
        return humanize_seconds(age.total_seconds())

    @admin.display(description="probe in flight", boolean=True)
    def probe_in_flight(self, obj):
        return obj.probe_token is not None

    @admin.display(description="last error")
    def error_excerpt(self, obj):
        return Truncator((obj.last_error or "").strip()).chars(EXCERPT)


from jobs import bulk_admin  # noqa: E402, F401  (registers the bulk operations list)
