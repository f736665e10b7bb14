"""Bulk resend from the admin: every delivery that failed in a time window (after an outage),
as one bulk operation (the two steps: ``jobs.admin.bulk_submit``). The filter is the
shell's (``webhooks resend``: since, until, state, endpoint); the window is drawn on the
database clock, and an empty or inverted one is refused before anything is written.
"""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import PermissionDenied

from jobs.admin.bulk_submit import submit_view
from jobs.bulk_models import BulkOperationKind
from jobs.operator.durations import parse_time_bound
from webhooks.bulk_resend import FAILED_STATES

OPERATION = BulkOperationKind.RESEND_DELIVERIES
FILTER_FIELDS = ("since", "until", "state", "endpoint")


class BulkResendFilterForm(forms.Form):
    since = forms.CharField(
        help_text="Window start: failed within a duration back (30m, 12h, 7d) or since an ISO-8601 time.",
        error_messages={"required": "Give the window's start (since): a resend needs one."},
    )
    until = forms.CharField(
        required=False, help_text="Window end (default: now): a duration back or an ISO-8601 time."
    )
    state = forms.MultipleChoiceField(
        required=False,
        choices=[(s, s) for s in FAILED_STATES],
        widget=forms.CheckboxSelectMultiple,
        help_text="Default: both.",
    )
    endpoint = forms.CharField(required=False, help_text="Only these endpoint ids (separated by spaces or commas).")

    def _bound(self, name: str):
        text = self.cleaned_data[name].strip()
        if not text:
            return None
        try:
            return parse_time_bound(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_since(self):
        return self._bound("since")

    def clean_until(self):
        return self._bound("until")

    def clean_endpoint(self):
        return [e for e in re.split(r"[\s,]+", self.cleaned_data["endpoint"]) if e]

    def bulk_filter(self) -> dict:
        """The filter as the operation stores it (``webhooks.bulk_resend.filter_params``)."""
        since_seconds, since_at = self.cleaned_data["since"]
        until_seconds, until_at = self.cleaned_data["until"] or (None, None)
        return {
            "states": self.cleaned_data["state"] or None,
            "since_seconds": since_seconds,
            "since_at": since_at.isoformat() if since_at else None,
            "until_seconds": until_seconds,
            "until_at": until_at.isoformat() if until_at else None,
            "endpoints": self.cleaned_data["endpoint"] or None,
        }

    def bulk_options(self) -> dict:
        return {}

    def hidden_pairs(self) -> list[tuple[str, str]]:
        pairs = [(name, self.data.get(name, "").strip()) for name in ("since", "until", "endpoint")]
        pairs += [("state", state) for state in self.cleaned_data["state"]]
        return [(name, value) for name, value in pairs if value]


def view(model_admin, request):
    if not model_admin.has_resend_permission(request):
        raise PermissionDenied
    return submit_view(
        model_admin,
        request,
        operation=OPERATION,
        make_filters=BulkResendFilterForm,
        filter_fields=FILTER_FIELDS,
        template="admin/webhooks/webhookdelivery/bulk_resend.html",
        title="Resend every delivery that failed in a window",
        noun="resend the deliveries that failed in the window",
        reason_required="A reason is required for a bulk resend: it is recorded with the operation "
        "and on each delivery's History.",
    )
