"""The forms behind the ops console's action pages: a required reason, the replay's force box.

Every action that records why reads it through :class:`ReasonForm` (never ``request.POST``
by hand): the text is trimmed, a blank one is refused with the action's own message, and
one longer than the stored column is refused rather than cut.
"""

from __future__ import annotations

from django import forms

from jobs.services.dead_letters import REASON_MAX


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label="Reason (required)",
        max_length=REASON_MAX,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
    )

    def __init__(self, *args, required_message: str = "A reason is required.", **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reason"].error_messages["required"] = required_message


class ReplayForm(forms.Form):
    """The replay confirmation's one choice; honoured only for a user allowed to force."""

    force = forms.BooleanField(
        required=False, label="Replay these anyway: I checked their effect did not happen."
    )


def bound_on_confirm(request) -> dict | None:
    """The POST to bind a form to on an action's confirming step (``post=yes``, the shape of
    Django's ``delete_selected``); None on the first step, which renders an unbound form."""
    return request.POST if request.POST.get("post") == "yes" else None
