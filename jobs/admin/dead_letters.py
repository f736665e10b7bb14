"""Dead letters in the ops console: the list, the detail, replay and discard (one by one or
selected), and the bulk replay of everything a filter matches (``jobs.admin.bulk_replay``).

Every action is a two-step POST in the shape of Django's ``delete_selected`` (a
confirmation or reason page re-posting the selected ids, then the act), gated by a custom
permission, and done by :mod:`jobs.services.dead_letters`, which writes the admin log entry
in the same transaction as the change. Ages are computed by PostgreSQL, never from the web
process's clock.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import DurationField, F
from django.db.models.expressions import ExpressionWrapper
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from jobs.admin import bulk_replay
from jobs.admin.base import EXCERPT, ReadOnlyAdmin, result_messages
from jobs.admin.forms import ReplayForm, bound_on_confirm
from jobs.models import DeadLetter, DeadLetterState, TransactionNow, db_ago
from jobs.operator.durations import humanize_seconds
from jobs.primitives import fence
from jobs.services import dead_letters as ops


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
        form = ReplayForm(bound_on_confirm(request))
        if form.is_bound and form.is_valid():
            force = form.cleaned_data["force"] and self.has_force_replay_permission(request)
            actor, user_id = request.user.get_username(), request.user.pk
            results = [
                ops.dead_letter_replay(letter_id=letter.pk, actor=actor, force=force, user_id=user_id)
                for letter in letters
            ]
            result_messages(request, results, "Replayed")
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
            form=form,
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

        def discard(reason: str, _options: dict) -> None:
            results = [
                ops.dead_letter_discard(letter_id=letter.pk, actor=actor, reason=reason, user_id=user_id)
                for letter in letters
            ]
            result_messages(request, results, "Discarded")

        return self._act_with_reason(
            request,
            letters,
            act=discard,
            reason_required="A reason is required to discard: say why nobody needs to replay this.",
            template="admin/jobs/deadletter/discard_form.html",
            title="Discard dead letters",
            letters=letters,
            pending=sum(1 for letter in letters if letter.state == DeadLetterState.PENDING_REVIEW),
        )

    # --- bulk replay: everything a filter matches, as one bulk operation ------------------

    def get_urls(self):
        view = self.admin_site.admin_view(self.bulk_replay_view)
        return [path("bulk-replay/", view, name="jobs_deadletter_bulk_replay"), *super().get_urls()]

    def bulk_replay_view(self, request):
        return bulk_replay.view(self, request)

    def changelist_view(self, request, extra_context=None):
        extra: dict[str, str | None] = {"bulk_replay_url": None}
        if self.has_replay_permission(request):
            query = bulk_replay.query_from_changelist(request.GET)
            extra["bulk_replay_url"] = reverse("admin:jobs_deadletter_bulk_replay") + (f"?{query}" if query else "")
        return super().changelist_view(request, {**(extra_context or {}), **extra})
