"""The webhook actions of the ops console, in two steps: resend deliveries, re-drive events.

First step: a page listing each selected row and what will happen to it (a delivery that
already succeeded is said so, and is sent again only if the operator ticks it), with a
required reason. Confirming step (``post=yes``): the service acts on each row in its own
transaction (a compare-and-swap: a row that moved meanwhile is skipped, not acted on twice)
and writes the row's History entry with who and why; one message says what was done, one
per skipped row says why.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages

from webhooks.models import DeliveryState, FanOut
from webhooks.services.redrive import redrive_event
from webhooks.services.resend import resend_delivery

FAILED = (DeliveryState.EXHAUSTED, DeliveryState.REFUSED)

# What a resend does to a delivery in each state (None: it is resent).
_RESEND_SKIP: dict[str, str] = {
    DeliveryState.PENDING: "waiting for its next attempt already (on its way)",
    DeliveryState.DELIVERING: "being delivered right now",
    DeliveryState.CANCELLED: "cancelled: its endpoint was deleted, there is nowhere to send it",
}
SUCCEEDED_NOTE = "already succeeded: the receiver answered 2xx"


class ResendForm(forms.Form):
    include_succeeded = forms.BooleanField(
        required=False,
        label="Also send the deliveries that already succeeded again (the merchant asked for them).",
    )


def resend_verdict(state: str, *, include_succeeded: bool) -> tuple[bool, str]:
    """(resent?, what the page says) for a delivery in ``state``. Pure: tested row by row."""
    if state in FAILED:
        return True, "resent: back to pending with a fresh retry ladder, due now"
    if state == DeliveryState.SUCCEEDED:
        if include_succeeded:
            return True, SUCCEEDED_NOTE + "; sent again, the receiver gets the same event id twice"
        return False, SUCCEEDED_NOTE + "; not sent again unless you tick the box below"
    return False, _RESEND_SKIP.get(state, f"in state {state}")


def resend(model_admin, request, queryset):
    deliveries = list(queryset.select_related("endpoint").order_by("id"))
    actor = request.user

    def act(reason: str, options: dict) -> None:
        include_succeeded = options["include_succeeded"]
        states = (*FAILED, DeliveryState.SUCCEEDED) if include_succeeded else FAILED
        resent, skipped = [], []
        for d in deliveries:  # each its own transaction; the CAS decides on the row as it is now
            if resend_delivery(d.pk, actor=actor, states=states, reason=reason):
                resent.append(d.pk)
            else:
                skipped.append(d.pk)
        if resent:
            ids = ", ".join(f"#{pk}" for pk in resent)
            messages.success(request, f"Resent {len(resent)} deliver{'y' if len(resent) == 1 else 'ies'}: {ids}.")
        states_now = dict(queryset.model.objects.filter(pk__in=skipped).values_list("pk", "state"))
        for pk in skipped:
            _resent, why = resend_verdict(states_now.get(pk, "gone"), include_succeeded=include_succeeded)
            messages.warning(request, f"Skipped: delivery #{pk} {why}.")

    rows = [(d, *resend_verdict(d.state, include_succeeded=False)) for d in deliveries]
    succeeded = sum(1 for d in deliveries if d.state == DeliveryState.SUCCEEDED)
    return model_admin._act_with_reason(
        request,
        deliveries,
        act=act,
        reason_required="A reason is required to resend: it is recorded on each delivery's History.",
        template="admin/webhooks/webhookdelivery/resend_confirmation.html",
        extra_form=ResendForm,
        title="Resend webhook deliveries",
        rows=rows,
        failed=sum(1 for d in deliveries if d.state in FAILED),
        succeeded=succeeded,
    )


def redrive_verdict(fan_out: str) -> tuple[bool, str]:
    """(re-driven?, what the page says) for an event whose fan-out is ``fan_out``."""
    if fan_out == FanOut.ABANDONED:
        return True, "re-driven: its fan-out starts again with the failure count reset"
    return False, f"its fan-out is {fan_out}, not abandoned: nothing to re-drive"


def redrive(model_admin, request, queryset):
    events = list(queryset.order_by("created_at", "id"))
    actor = request.user

    def act(reason: str, _options: dict) -> None:
        done: list[str] = []
        skipped: list[str] = []
        for event in events:
            (done if redrive_event(event.pk, actor=actor, reason=reason) else skipped).append(event.pk)
        if done:
            messages.success(request, f"{len(done)} event{'' if len(done) == 1 else 's'} back to pending fan-out.")
        if skipped:
            messages.warning(request, f"{len(skipped)} skipped: not abandoned ({', '.join(skipped)}).")

    rows = [(e, *redrive_verdict(e.fan_out)) for e in events]
    return model_admin._act_with_reason(
        request,
        events,
        act=act,
        reason_required="A reason is required to re-drive: say what was fixed. It is recorded on each event's History.",
        template="admin/webhooks/event/redrive_confirmation.html",
        title="Re-drive abandoned events",
        rows=rows,
        abandoned=sum(1 for _, ok, _ in rows if ok),
    )
