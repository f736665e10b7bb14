"""How long a poll the rail's ceiling (or its worker's share) held back waits before it asks
again (charges/services/rail_gate.py): briefly, doubling at each deferral in a row, while the
slots are held by requests that are moving; the long wait while the oldest request in flight
has been out for a second or more. The in-process worker loop against the sandbox rail over
HTTP and the real database."""

from __future__ import annotations

import pytest

from charges import request_log
from charges.models import RequestOperation
from charges.services import rail_calls, rail_gate
from charges.services.rail_gate import SHARES, RailDeferred
from tests.charges_support import sql
from tests.test_charges_poll import job_of, live_charge
from tests.test_rail_guards import known_charge, merchant, poll_now, rail_gate_rail, requests_of  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

SOON = rail_gate.SOON_WAIT_SECONDS
JITTER = 1.0 + rail_gate.JITTER


@pytest.mark.parametrize("deferrals", range(8))
def test_a_soon_deferral_waits_the_short_wait_doubled_per_deferral_in_a_row_capped_by_the_long_one(deferrals):
    long_wait = 1.0
    exc = RailDeferred("x", delay_seconds=long_wait, for_slot=True, soon=True)
    expected = min(SOON * 2**deferrals, long_wait)
    for _ in range(50):
        assert expected <= exc.delay_after(deferrals) <= expected * JITTER
    assert rail_gate.slot_wait(deferrals) == SOON * 2**deferrals


@pytest.mark.parametrize("deferrals", [0, 3])
def test_a_deferral_that_is_not_soon_keeps_its_own_wait(deferrals):
    assert RailDeferred("x", delay_seconds=4.2, for_slot=True).delay_after(deferrals) == 4.2
    assert RailDeferred("x", delay_seconds=4.2).delay_after(deferrals) == 4.2  # the breaker's


def hold_the_slot(merchant, age: float) -> None:  # noqa: F811
    """A request to the rail out and unanswered for ``age`` seconds: the ceiling's one slot."""
    other = live_charge(merchant, status="submitted", job=False)
    request_log.record_sent(
        other.id, RequestOperation.SUBMIT, rail="sandbox_push", method="POST", path="/x", idempotency_key=None
    )
    sql("UPDATE provider_requests SET sent_at = now() - make_interval(secs => %s)", [age])


def test_a_poll_over_a_ceiling_held_by_a_moving_request_asks_again_within_moments(
    merchant,  # noqa: F811
    settings,
    sandbox_rail,
):
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    hold_the_slot(merchant, age=0.2)  # a confirm's submit, say: the web process frees it, waking nobody
    charge = known_charge(merchant, sandbox_rail)
    poll_now(charge.id)
    due_in, reason = job_of(charge.id)
    assert requests_of(charge.id) == 0 and "has its ceiling (1) in flight" in reason
    assert 0 < due_in <= SOON * JITTER
    poll_now(charge.id)  # still held: the second deferral in a row waits twice as long
    due_in, _ = job_of(charge.id)
    assert SOON * 2 * 0.9 <= due_in <= SOON * 2 * JITTER


def test_a_poll_over_a_ceiling_held_by_a_request_out_for_a_second_keeps_the_long_wait(
    merchant,  # noqa: F811
    settings,
    sandbox_rail,
):
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    age = rail_gate.MOVING_AGE_SECONDS + 0.5  # the rail is slow or gone
    hold_the_slot(merchant, age=age)
    charge = known_charge(merchant, sandbox_rail)
    poll_now(charge.id)
    due_in, reason = job_of(charge.id)
    assert "has its ceiling (1) in flight" in reason
    # Until the request in flight passes its bound, within the long wait's limits.
    bound = settings.VPAY_RAIL_TIMEOUT_SECONDS + rail_calls.IN_FLIGHT_MARGIN_SECONDS
    expected = min(max(bound - age, rail_gate.MIN_WAIT_SECONDS), rail_gate.CEILING_MAX_WAIT_SECONDS)
    assert expected - 0.1 <= due_in <= expected * JITTER


def test_the_workers_own_share_held_is_a_soon_deferral(merchant, sandbox_rail):  # noqa: F811
    charge = known_charge(merchant, sandbox_rail, job=False)
    assert SHARES.acquire("sandbox_push", 1)  # another executor of this worker is inside a call
    try:
        with pytest.raises(RailDeferred, match="share") as refused:
            rail_calls.status(charge.id, rail_gate_rail(), pay_token=None, share=1)
    finally:
        SHARES.release("sandbox_push")
    assert refused.value.soon and refused.value.for_slot
