"""What the hosted page shows for a session, as a pure table (unit-tested exhaustively in
``tests/test_checkout_decisions.py``): the session's and its intent's states in, a page (or a
redirect) and its HTTP status out. The views only load the rows and carry the answer out."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from charges.states import CheckoutSessionStatus, IntentStatus


class Page(Enum):
    PAY = "pay"  # the amount, the merchant, a button to pay
    FOLLOWING = "following"  # the payment is under way: the page refreshes until it settles
    TO_SUCCESS = "to_success"  # paid, and the merchant gave a success_url: send the browser there
    PAID = "paid"  # paid, no success_url: say so
    FAILED = "failed"  # the payment failed; the intent cannot be confirmed again
    EXPIRED = "expired"  # the session expired (or its intent was canceled) unpaid
    UNKNOWN = "unknown"  # no such session


@dataclass(frozen=True)
class Shown:
    page: Page
    status: int  # the HTTP status of a page; 303 for a redirect


def decide(
    *,
    found: bool,
    session_status: str = "",
    past_expiry: bool = False,
    intent_status: str = "",
    has_success_url: bool = False,
) -> Shown:
    """The page for a session. A live payment is followed even past the session's expiry (the
    sweep leaves a session with a live charge alone); an unpaid one past it is gone (410).
    A redirect rail's payer is sent to the rail once, by the pay button (checkout.views.pay);
    the page itself only follows the payment, so a payer the rail sends back is not bounced
    to the rail again before the worker has heard the answer."""
    if not found:
        return Shown(Page.UNKNOWN, 404)
    if intent_status == IntentStatus.CANCELED:
        # Also after the payer approved an authorization the merchant then canceled (the
        # session had completed): the hold is released, and nothing was charged.
        return Shown(Page.EXPIRED, 410)
    if session_status == CheckoutSessionStatus.COMPLETE or intent_status in (
        IntentStatus.SUCCEEDED,
        IntentStatus.REQUIRES_CAPTURE,  # authorized: the payer's part is done
    ):
        return Shown(Page.TO_SUCCESS, 303) if has_success_url else Shown(Page.PAID, 200)
    if intent_status in (IntentStatus.PROCESSING, IntentStatus.REQUIRES_ACTION):
        return Shown(Page.FOLLOWING, 200)
    if intent_status == IntentStatus.FAILED:
        return Shown(Page.FAILED, 200)
    if (
        session_status == CheckoutSessionStatus.EXPIRED
        or past_expiry
        or intent_status != IntentStatus.REQUIRES_CONFIRMATION
    ):
        return Shown(Page.EXPIRED, 410)
    return Shown(Page.PAY, 200)
