"""How long a poll the rail's ceiling (or its worker's share) held back waits before it asks
again (charges/services/rail_gate.py): briefly, doubling at each deferral in a row, while the
slots are held by requests that are moving and few of its process's polls already wait; the
long wait otherwise. Each caller that defers (a charge's poll, a refund's, a void) asks for
it. The in-process worker loop against the sandbox rail over HTTP and the real database."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from charges import request_log
from charges.models import RequestOperation
from charges.services import polling, rail_calls, rail_gate, rail_slots, refund_polling, void_failed
from charges.services.rail_gate import SHARES, RailDeferred
from charges.services.rail_slots import RailWaiters
from tests.charges_support import sql
from tests.test_charges_poll import job_of, live_charge
from tests.test_rail_guards import known_charge, merchant, poll_now, rail_gate_rail, requests_of  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

SOON = rail_gate.SOON_WAIT_SECONDS
JITTER = 1.0 + rail_gate.JITTER


@pytest.fixture
def no_waiters(monkeypatch):
    waiters = RailWaiters()
    monkeypatch.setattr(rail_slots, "WAITERS", waiters)
    return waiters


@pytest.fixture
def unjittered(monkeypatch):
    """random() at its middle: a soon wait is exactly slot_wait, a long one its base times 1.125."""
    monkeypatch.setattr(rail_gate.random, "random", lambda: 0.5)


@pytest.mark.parametrize("deferrals", range(8))
def test_a_soon_deferral_waits_the_short_wait_doubled_per_deferral_spread_and_never_past_the_long_one(deferrals):
    long_wait = 1.1
    exc = RailDeferred("x", delay_seconds=long_wait, for_slot=True, soon=True)
    expected = SOON * 2**deferrals
    for _ in range(50):
        assert min(expected * 0.5, long_wait) <= exc.delay_after(deferrals) <= min(expected * 1.5, long_wait)
    assert rail_gate.slot_wait(deferrals) == expected


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
    no_waiters,
    unjittered,
):
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    hold_the_slot(merchant, age=0.2)  # a confirm's submit, say: the web process frees it, waking nobody
    charge = known_charge(merchant, sandbox_rail)
    poll_now(charge.id)
    due_in, reason = job_of(charge.id)
    assert requests_of(charge.id) == 0 and "has its ceiling (1) in flight" in reason
    assert 0 < due_in <= SOON
    poll_now(charge.id)  # still held: the second deferral in a row waits twice as long
    due_in, _ = job_of(charge.id)
    assert SOON < due_in <= SOON * 2


def test_a_poll_that_runs_no_longer_counts_as_waiting(merchant, sandbox_rail, no_waiters):  # noqa: F811
    """Run on its timer, not woken: its name, left, would count against the short wait. (A
    settled charge's poll: no request of its own frees a slot and passes the name over.)"""
    charge = live_charge(merchant, status="succeeded")
    no_waiters.add("sandbox_push", f"charge:poll:{charge.id}")
    poll_now(charge.id)
    assert requests_of(charge.id) == 0 and no_waiters.count("sandbox_push") == 0


def test_with_as_many_of_its_polls_waiting_as_the_ceiling_a_poll_keeps_the_long_wait(
    merchant,  # noqa: F811
    settings,
    sandbox_rail,
    no_waiters,
    unjittered,
):
    """Many deferred at once would come back in waves to fight over the ceiling: past the
    ceiling's number of this process's waiters, the freed slots wake them in turn instead."""
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    hold_the_slot(merchant, age=0.2)
    no_waiters.add("sandbox_push", "charge:poll:ch_other")
    charge = known_charge(merchant, sandbox_rail)
    poll_now(charge.id)
    due_in, reason = job_of(charge.id)
    assert "has its ceiling (1) in flight" in reason and due_in >= rail_gate.MIN_WAIT_SECONDS


def test_a_poll_over_a_ceiling_held_by_a_request_out_for_a_second_keeps_the_long_wait(
    merchant,  # noqa: F811
    settings,
    sandbox_rail,
    no_waiters,
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


def test_the_workers_own_share_held_is_a_soon_deferral(merchant, sandbox_rail, no_waiters):  # noqa: F811
    charge = known_charge(merchant, sandbox_rail, job=False)
    assert SHARES.acquire("sandbox_push", 1)  # another executor of this worker is inside a call
    try:
        with pytest.raises(RailDeferred, match="share") as refused:
            rail_calls.status(charge.id, rail_gate_rail(), pay_token=None, share=1)
    finally:
        SHARES.release("sandbox_push")
    assert refused.value.soon and refused.value.for_slot


def soon_deferral() -> RailDeferred:
    return RailDeferred("rail sandbox_push has its ceiling (8) in flight", delay_seconds=5.0, for_slot=True, soon=True)


# A job context as each handler reads it on a deferral: its deferrals so far, and some left.
CTX = SimpleNamespace(deferrals=3, deferrals_left=10, worker_concurrency=4, payload={})


def test_a_charges_poll_and_a_refunds_poll_take_the_soon_wait(no_waiters, unjittered):
    row = SimpleNamespace(rail="sandbox_push", id="ch_x")
    for deferred in (polling._deferred, refund_polling._deferred):
        outcome = deferred(CTX, row, None, soon_deferral())
        assert outcome.delay == rail_gate.slot_wait(3) == SOON * 8


def test_a_void_takes_the_soon_wait(merchant, monkeypatch, unjittered):  # noqa: F811
    charge = live_charge(merchant, status="failed", job=False)

    def deferred(*args, **kwargs):
        raise soon_deferral()

    monkeypatch.setattr(rail_calls, "void", deferred)
    outcome = void_failed.void_charge(SimpleNamespace(**{**vars(CTX), "payload": {"charge_id": charge.id}}))
    assert outcome.delay == rail_gate.slot_wait(3)
