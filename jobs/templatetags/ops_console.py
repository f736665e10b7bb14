"""The admin index's panels: the overview's link, and dead letters waiting for a human."""

from __future__ import annotations

from django import template
from django.urls import reverse

from jobs.models import DeadLetter, DeadLetterState

register = template.Library()


@register.inclusion_tag("admin/jobs/attention.html", takes_context=True)
def dead_letters_attention(context):
    """How many dead letters are pending review, linked to that filtered list; shown to
    whoever may view dead letters."""
    request = context.get("request")
    if request is None or not request.user.has_perm("jobs.view_deadletter"):
        return {"visible": False}
    url = reverse("admin:jobs_deadletter_changelist") + f"?state__exact={DeadLetterState.PENDING_REVIEW}"
    return {"visible": True, "pending": DeadLetter.objects.pending_review().count(), "url": url}


@register.inclusion_tag("admin/overview/link.html", takes_context=True)
def overview_link(context):
    """The link to the last hour's charts, for whoever may see them (vpay/overview)."""
    request = context.get("request")
    return {"visible": request is not None and request.user.has_perm("jobs.view_job"), "url": reverse("admin-overview")}
