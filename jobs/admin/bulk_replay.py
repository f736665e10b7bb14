"""Bulk replay from the admin: every pending dead letter a filter matches, as one bulk
operation (the two steps: ``jobs.admin.bulk_submit``). The filter is the shell's
(``deadletters replay --bulk``: kind, queue, cause, since, or every pending letter, and
force for whoever may); the dead letters list links here with its own filters carried over.
"""

from __future__ import annotations

from typing import cast
from urllib.parse import urlencode

from django import forms
from django.core.exceptions import PermissionDenied

from jobs.admin.bulk_submit import submit_view
from jobs.bulk_models import BulkOperationKind
from jobs.models import DeadLetter
from jobs.operator.durations import parse_time_bound

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
            field = cast(forms.MultipleChoiceField, self.fields[name])  # declared above as one
            field.choices = [(v, v) for v in sorted({*present, *asked})]
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
        super().clean()
        cleaned = self.cleaned_data  # what Form.clean() returns
        filtered = any(cleaned.get(name) for name in ("kind", "queue", "cause", "since"))
        if not self.errors and not filtered and not cleaned.get("all_pending"):
            raise forms.ValidationError(
                "Give a filter (kind, queue, cause, since), or tick “every pending dead letter”."
            )
        return cleaned

    def bulk_filter(self) -> dict:
        """The filter as the operation stores it (``jobs.operator.bulk_replay.filter_params``)."""
        since_seconds, since_at = self.cleaned_data["since"] or (None, None)
        return {
            "kinds": self.cleaned_data["kind"] or None,
            "queues": self.cleaned_data["queue"] or None,
            "causes": self.cleaned_data["cause"] or None,
            "since_seconds": since_seconds,
            "since_at": since_at.isoformat() if since_at else None,
        }

    def bulk_options(self) -> dict:
        return {"force": bool(self.cleaned_data.get("force"))}

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
    if not model_admin.has_replay_permission(request):
        raise PermissionDenied
    can_force = model_admin.has_force_replay_permission(request)
    return submit_view(
        model_admin,
        request,
        operation=OPERATION,
        make_filters=lambda data: BulkReplayFilterForm(data, can_force=can_force),
        filter_fields=FILTER_FIELDS,
        template="admin/jobs/deadletter/bulk_replay.html",
        title="Replay every pending dead letter a filter matches",
        noun="replay pending dead letters",
        reason_required="A reason is required for a bulk replay: it is recorded with the operation.",
    )
