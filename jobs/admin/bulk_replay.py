"""Bulk replay from the admin: every pending dead letter a filter matches, as one bulk operation.

The page is the confirmation step: a GET with the filter (the shell's: kind, queue, cause,
since; or every pending letter) says how many letters match now, on the database clock, and
asks for a reason. The POST re-sends that filter with the reason and submits one operation
(``jobs.services.bulk.bulk_operation_submit``: two rows, whatever it matches); the operator
lands on its page, which follows its progress. Nothing is written before that POST, and a
POST that fails validation writes nothing either.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from jobs.admin.forms import ReasonForm
from jobs.bulk_models import BulkOperationKind
from jobs.durations import parse_time_bound
from jobs.models import DeadLetter
from jobs.services import bulk

OPERATION = BulkOperationKind.REPLAY_DEAD_LETTERS
FILTER_FIELDS = ("kind", "queue", "cause", "since", "all_pending")
# The dead letters list's filters that mean the same as the bulk filter's.
FROM_CHANGELIST = {"kind__exact": "kind", "queue__exact": "queue", "cause__exact": "cause"}
CREATED_TO_SINCE = {"1h": "1h", "24h": "24h", "7d": "7d", "30d": "30d"}


class BulkReplayFilterForm(forms.Form):
    """The shell's ``deadletters replay --bulk`` filters; each choice list is what pending
    letters carry now, plus anything asked for (a stale link matches nothing, it does not fail)."""

    kind = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    queue = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    cause = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    since = forms.CharField(
        required=False, help_text="Created within a duration (30m, 12h, 7d) or since an ISO-8601 time."
    )
    all_pending = forms.BooleanField(required=False, label="Every pending dead letter (no filter)")
    force = forms.BooleanField(
        required=False, label="Replay letters past the fence horizon too: I checked their effect did not happen."
    )

    def __init__(self, data=None, *, can_force: bool):
        super().__init__(data)
        for name in ("kind", "queue", "cause"):
            present = DeadLetter.objects.pending_review().values_list(name, flat=True).distinct().order_by(name)
            asked = data.getlist(name) if data is not None else []
            self.fields[name].choices = [(v, v) for v in sorted({*present, *asked})]
        if not can_force:
            del self.fields["force"]

    def clean_since(self):
        text = self.cleaned_data["since"].strip()
        if not text:
            return None
        try:
            return parse_time_bound(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self):
        cleaned = super().clean()
        filtered = any(cleaned.get(name) for name in ("kind", "queue", "cause", "since"))
        if not self.errors and not filtered and not cleaned.get("all_pending"):
            raise forms.ValidationError(
                "Give a filter (kind, queue, cause, since), or tick “every pending dead letter”."
            )
        return cleaned

    def bulk_filter(self) -> dict:
        """The filter as the operation stores it (``jobs.bulk_replay.filter_params``)."""
        since_seconds, since_at = self.cleaned_data["since"] or (None, None)
        return {
            "kinds": self.cleaned_data["kind"] or None,
            "queues": self.cleaned_data["queue"] or None,
            "causes": self.cleaned_data["cause"] or None,
            "since_seconds": since_seconds,
            "since_at": since_at.isoformat() if since_at else None,
        }

    def hidden_pairs(self) -> list[tuple[str, str]]:
        """The filter re-posted by the confirming form, exactly as it was counted."""
        pairs = [(name, value) for name in ("kind", "queue", "cause") for value in self.cleaned_data[name]]
        if self.data.get("since", "").strip():
            pairs.append(("since", self.data["since"].strip()))
        pairs += [(name, "on") for name in ("all_pending", "force") if self.cleaned_data.get(name)]
        return pairs


def query_from_changelist(params) -> str:
    """The dead letters list's current filters as this page's query (the list's own state
    filter is dropped: a bulk replay matches only pending letters)."""
    pairs = [(ours, params[theirs]) for theirs, ours in FROM_CHANGELIST.items() if params.get(theirs)]
    since = CREATED_TO_SINCE.get(params.get("created", ""))
    if since:
        pairs.append(("since", since))
    return urlencode(pairs)


def view(model_admin, request):
    """GET: the count and the reason form; POST: submit, then the operation's page."""
    if not model_admin.has_replay_permission(request):
        raise PermissionDenied
    can_force = model_admin.has_force_replay_permission(request)
    posted = request.method == "POST"
    data = request.POST if posted else (request.GET if any(k in request.GET for k in FILTER_FIELDS) else None)
    filters = BulkReplayFilterForm(data, can_force=can_force)
    reason = ReasonForm(
        request.POST if posted else None,
        required_message="A reason is required for a bulk replay: it is recorded with the operation.",
    )
    preview = None
    if filters.is_bound and filters.is_valid():
        try:
            preview = bulk.bulk_operation_preview(operation=OPERATION, filter=filters.bulk_filter())
        except bulk.BulkRefused as exc:
            filters.add_error(None, str(exc))
    if posted and preview is not None and reason.is_valid():
        operation_id = bulk.bulk_operation_submit(
            operation=OPERATION,
            filter=filters.bulk_filter(),
            options={"force": bool(filters.cleaned_data.get("force"))},
            actor=request.user.get_username(),
            user_id=request.user.pk,
            reason=reason.cleaned_data["reason"],
        )
        messages.success(
            request,
            f"Submitted bulk operation #{operation_id}: replay the {preview.matched} pending dead letter"
            f"{'' if preview.matched == 1 else 's'} the filter matched (the workers expand it).",
        )
        return HttpResponseRedirect(landing_url(request, operation_id, "admin:jobs_deadletter_changelist"))
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Replay every pending dead letter a filter matches",
        "filters": filters,
        "form": reason,
        "preview": preview,
        "hidden": filters.hidden_pairs() if preview is not None else [],
        "force_shown": can_force,
    }
    status = 400 if posted else 200
    return TemplateResponse(request, "admin/jobs/deadletter/bulk_replay.html", context, status=status)


def landing_url(request, operation_id: int, fallback: str) -> str:
    """After a submit: the operation's own page (its progress), or ``fallback`` for someone
    who may not view bulk operations."""
    if request.user.has_perm("jobs.view_bulkoperation"):
        return reverse("admin:jobs_bulkoperation_change", args=[operation_id])
    return reverse(fallback)
