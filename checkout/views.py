"""The hosted checkout page (``GET /checkout/<session id>``) and its pay button
(``POST /checkout/<session id>/pay``).

The page is the payer's side of a checkout session. Paying confirms the session's intent
through the same service as ``POST /v1/payment_intents/{id}/confirm`` (same guards: a
session past its expiry, a canceled intent, an open rail breaker), behind Django's CSRF
check. What to show is :func:`checkout.decisions.decide`; this module loads the rows, asks,
and renders. The page shows the merchant's name, the amount and the return links: never the
client secret, the payer's credentials or anything of the rail's but the URL a redirect rail
hands the payer. Domain errors become pages here, as ``api/`` turns them into JSON for the
API: this is the one other surface that answers HTTP to a person.
"""

from __future__ import annotations

from functools import wraps

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from charges.models import Charge, CheckoutSession
from charges.money import format_amount
from charges.services.confirm import confirm_intent
from charges.states import IntentStatus
from checkout.decisions import Page, Shown, decide
from jobs.models import TransactionNow
from vpay.errors import DomainError, InvalidState, NotFound, Unavailable

SESSION_ID_PLACEHOLDER = "{CHECKOUT_SESSION_ID}"
REFRESH_SECONDS = 2
# What a refused pay button answers (the API's mapping for the same errors).
_REFUSAL_STATUS = ((Unavailable, 503), (InvalidState, 409), (NotFound, 404))


def private(view):
    """Never cached, and the session id in the address never sent on as a Referer to another
    site (a rail the browser is redirected to, a link the merchant gave). ``same-origin``, not
    ``no-referrer``: under the latter the browser sends ``Origin: null`` with the pay form,
    which the CSRF check rightly refuses."""

    @wraps(view)
    def wrapped(request: HttpRequest, session_id: str) -> HttpResponse:
        response = view(request, session_id)
        response["Cache-Control"] = "no-store"
        response["Referrer-Policy"] = "same-origin"
        return response

    return wrapped


def _load(session_id: str) -> CheckoutSession | None:
    # By primary key; the intent and the merchant in the same query; past_expiry on the
    # database's clock, as the confirm's own guard judges it.
    return (
        CheckoutSession.objects.select_related("intent", "merchant")
        .annotate(past_expiry=ExpressionWrapper(Q(expires_at__lte=TransactionNow()), output_field=BooleanField()))
        .filter(pk=session_id)
        .first()
    )


def _redirect_url(session: CheckoutSession) -> str | None:
    charge = Charge.objects.filter(intent_id=session.intent_id).only("redirect_url").first()
    return charge.redirect_url if charge is not None else None


def _decide(session: CheckoutSession | None) -> Shown:
    if session is None:
        return decide(found=False)
    return decide(
        found=True,
        session_status=session.status,
        past_expiry=session.past_expiry,
        intent_status=session.intent.status,
        has_success_url=bool(session.success_url),
    )


def _see_other(url: str) -> HttpResponse:
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


def _render(request: HttpRequest, session: CheckoutSession | None, page: Page, status: int, error: str = ""):
    context: dict = {"page": page.value, "error": error, "refresh": REFRESH_SECONDS}
    if page is Page.FOLLOWING and session is not None and session.intent.status == IntentStatus.REQUIRES_ACTION:
        # A payer who came back before approving can go on to the rail from here.
        context["rail_url"] = _redirect_url(session)
    if session is not None:
        context.update(
            session_id=session.pk,
            merchant_name=session.merchant.name,
            amount=format_amount(session.intent.amount, session.intent.currency),
            cancel_url=session.cancel_url,
            pay_url=reverse("checkout-pay", args=[session.pk]),
        )
    return render(request, f"checkout/{page.value}.html", context, status=status)


@private
@require_GET
def page(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _load(session_id)
    shown = _decide(session)
    if shown.page is Page.TO_SUCCESS:
        assert session is not None
        return _see_other(session.success_url.replace(SESSION_ID_PLACEHOLDER, session.pk))
    return _render(request, session, shown.page, shown.status)


@private
@require_POST
def pay(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _load(session_id)
    shown = _decide(session)
    if shown.page is not Page.PAY:
        # Paid, under way, expired or unknown since the page was drawn: show what it is now.
        return _see_other(reverse("checkout-page", args=[session_id]))
    assert session is not None
    try:
        confirm_intent(session.merchant, session.intent_id)
    except DomainError as exc:
        status = next((code for kind, code in _REFUSAL_STATUS if isinstance(exc, kind)), 400)
        again = _load(session_id)
        if _decide(again).page is not Page.PAY:
            return _see_other(reverse("checkout-page", args=[session_id]))
        response = _render(request, again, Page.PAY, status, error=exc.message)
        if isinstance(exc, Unavailable):
            response["Retry-After"] = str(exc.retry_after)
        return response
    intent = session.intent
    intent.refresh_from_db(fields=["status"])
    if intent.status == IntentStatus.REQUIRES_ACTION:
        # A redirect rail: the payer approves on the rail's page, sent there once, from here.
        rail_url = _redirect_url(session)
        if rail_url:
            return _see_other(rail_url)
    return _see_other(reverse("checkout-page", args=[session_id]))
