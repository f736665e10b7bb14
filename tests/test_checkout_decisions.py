"""checkout.decisions.decide, exhaustively: every session status, intent status and flag."""

from __future__ import annotations

import itertools

from charges.states import CheckoutSessionStatus, IntentStatus
from checkout.decisions import Page, Shown, decide


def expected(session_status, past_expiry, intent_status, has_success_url) -> Shown:
    """The table, written out by rule, first match wins."""
    if intent_status == "canceled":
        return Shown(Page.EXPIRED, 410)  # whatever the session says: nothing was charged
    paid = session_status == "complete" or intent_status in ("succeeded", "requires_capture")
    if paid:
        return Shown(Page.TO_SUCCESS, 303) if has_success_url else Shown(Page.PAID, 200)
    if intent_status in ("processing", "requires_action"):
        return Shown(Page.FOLLOWING, 200)  # a live payment is followed even past the expiry
    if intent_status == "failed":
        return Shown(Page.FAILED, 200)
    if intent_status == "requires_confirmation" and session_status == "open" and not past_expiry:
        return Shown(Page.PAY, 200)
    return Shown(Page.EXPIRED, 410)  # expired, past it, or canceled


CASES = list(
    itertools.product(
        CheckoutSessionStatus.values, (False, True), IntentStatus.values, (False, True)
    )
)


def test_every_combination():
    wrong = []
    for case in CASES:
        session_status, past_expiry, intent_status, has_success_url = case
        got = decide(
            found=True,
            session_status=session_status,
            past_expiry=past_expiry,
            intent_status=intent_status,
            has_success_url=has_success_url,
        )
        if got != expected(*case):
            wrong.append((case, got))
    assert len(CASES) == 3 * 2 * 7 * 2
    assert wrong == []


def test_an_unknown_session_is_a_404_whatever_else_is_said():
    assert decide(found=False, session_status="complete", intent_status="succeeded") == Shown(Page.UNKNOWN, 404)


def test_the_table_is_what_the_pages_are():
    pages = {expected(*c).page for c in CASES} | {Page.UNKNOWN}
    assert pages == set(Page)
