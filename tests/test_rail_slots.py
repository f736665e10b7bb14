"""A freed rail slot goes to the longest-waiting poll of this process
(charges/services/rail_slots.py): the waiters' table, exhaustively, then on the shipping
path against the sandbox rail over HTTP and the real database."""

from __future__ import annotations

import pytest

from charges import request_log
from charges.models import RequestOperation
from charges.services import rail_calls, rail_slots
from charges.services.rail_slots import RailWaiters
from tests import test_rail_guards
from tests.charges_support import charge_of, scalar, sql
from tests.test_charges_poll import job_of, live_charge
from tests.test_rail_guards import known_charge, poll_now, rail_gate_rail

merchant = test_rail_guards.merchant  # the guards' fixture: a merchant on the sandbox rails, fast policy


def test_waiters_are_woken_longest_waiting_first_and_once():
    w = RailWaiters()
    for name in ("a", "b", "c"):
        w.add("r", name)
    w.add("r", "a")  # deferred again: it waits from now
    assert w.waiting("r") == ["b", "c", "a"]
    assert w.take("r", 2) == ["b", "c"] and w.take("other", 1) == []
    w.put_back("r", ["c"])
    assert w.waiting("r") == ["c", "a"]
    assert w.take("r", 5) == ["c", "a"] and w.waiting("r") == [] and w.take("r", 1) == []


def test_waiters_remember_at_most_their_limit_forgetting_the_oldest():
    w = RailWaiters(limit=2)
    for name in ("a", "b", "c"):
        w.add("r", name)
    assert w.waiting("r") == ["b", "c"]  # "a" keeps its own timer


def test_a_waiter_that_runs_is_forgotten_and_the_rest_keep_their_places():
    w = RailWaiters()
    for name in ("a", "b", "c"):
        w.add("r", name)
    w.discard("r", "b")
    w.discard("r", "gone")
    w.discard("other", "a")
    assert w.waiting("r") == ["a", "c"] and w.count("r") == 2
    w.discard("r", "a")
    w.discard("r", "c")
    assert w.count("r") == 0 and w.take("r", 1) == []


def test_put_back_keeps_the_order_and_never_duplicates():
    w = RailWaiters()
    w.add("r", "z")
    w.put_back("r", ["x", "y", "z"])
    assert w.waiting("r") == ["x", "y", "z"]


@pytest.fixture
def no_waiters(monkeypatch):
    waiters = RailWaiters()
    monkeypatch.setattr(rail_slots, "WAITERS", waiters)
    return waiters


def deferred(charge_id: str) -> None:
    """The charge's poll job as a deferral leaves it: waiting 5 s, its deferrals counted."""
    sql(
        "UPDATE jobs SET run_at = now() + interval '5 seconds', deferrals = deferrals + 1 WHERE dedupe_key = %s",
        [f"charge:poll:{charge_id}"],
    )


def due_in(charge_id: str) -> float:
    return scalar(
        "SELECT EXTRACT(EPOCH FROM run_at - now())::float8 FROM jobs WHERE dedupe_key = %s",
        [f"charge:poll:{charge_id}"],
    )


@pytest.mark.django_db(transaction=True)
def test_a_poll_deferred_at_the_ceiling_runs_as_soon_as_a_request_of_this_process_frees_the_slot(
    merchant, settings, sandbox_rail, no_waiters
):
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 1
    holder = live_charge(merchant, status="submitted", job=False)
    held = request_log.record_sent(  # a request out and unanswered: it holds the one slot
        holder.id, RequestOperation.STATUS, rail="sandbox_push", method="GET", path="/x", idempotency_key=None
    )
    # Out for two seconds: no longer a moving request, so the poll takes the long wait
    # (tests/test_rail_slot_waits.py), which only the freed slot cuts short.
    sql("UPDATE provider_requests SET sent_at = now() - interval '2 seconds' WHERE id = %s", [held])
    waiting = known_charge(merchant, sandbox_rail, amount=5000)
    poll_now(waiting.id)
    assert "has its ceiling (1) in flight" in job_of(waiting.id)[1]
    assert due_in(waiting.id) >= 1.0  # deferred for at least a second
    assert no_waiters.waiting("sandbox_push") == [f"charge:poll:{waiting.id}"]
    # The held request is answered, and another request of this process ends: the slot it
    # frees goes to the waiting poll at once, not when its timer ends.
    sql("UPDATE provider_requests SET status_code = 200, answered_at = now() WHERE id = %s", [held])
    other = known_charge(merchant, sandbox_rail, amount=5000, job=False)
    assert rail_calls.status(other.id, rail_gate_rail(), pay_token=None).http_status == 200
    assert due_in(waiting.id) <= 0 and no_waiters.waiting("sandbox_push") == []
    poll_now(waiting.id)
    assert charge_of(waiting.intent_id)["status"] == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_a_freed_slot_passes_over_a_waiter_that_moved_on_and_asks_nothing_with_nobody_waiting(
    merchant, sandbox_rail, no_waiters, django_assert_max_num_queries
):
    gone = "charge:poll:ch_gone"  # no such job: it ran elsewhere, or settled
    first, second = (known_charge(merchant, sandbox_rail, amount=5000) for _ in range(2))
    for charge in (first, second):
        deferred(charge.id)
    for name in (gone, f"charge:poll:{first.id}", f"charge:poll:{second.id}"):
        no_waiters.add("sandbox_push", name)
    assert rail_slots.slot_freed("sandbox_push") == f"charge:poll:{first.id}"
    assert no_waiters.waiting("sandbox_push") == [f"charge:poll:{second.id}"]  # still waits its turn
    assert due_in(first.id) <= 0 < due_in(second.id)
    no_waiters.take("sandbox_push", 1)
    with django_assert_max_num_queries(0):
        assert rail_slots.slot_freed("sandbox_push") is None


@pytest.mark.django_db(transaction=True)
def test_a_poll_the_breaker_holds_back_waits_its_timer_not_for_a_slot(merchant, sandbox_rail, no_waiters):
    test_rail_guards.open_the_rails_breaker(merchant, sandbox_rail)
    charge = known_charge(merchant, sandbox_rail, amount=5000)
    poll_now(charge.id)
    assert "breaker" in job_of(charge.id)[1] and no_waiters.waiting("sandbox_push") == []


@pytest.mark.django_db(transaction=True)
def test_a_request_that_fails_frees_its_slot_for_a_waiter_too(merchant, sandbox_rail, no_waiters):
    sandbox_rail.scenario(amount=5503, error_polls=1)  # the first poll of this one answers 503
    failing = known_charge(merchant, sandbox_rail, amount=5503, job=False)
    waiting = known_charge(merchant, sandbox_rail, amount=5000)
    deferred(waiting.id)
    no_waiters.add("sandbox_push", f"charge:poll:{waiting.id}")
    with pytest.raises(rail_calls.RailUnavailable):
        rail_calls.status(failing.id, rail_gate_rail(), pay_token=None)
    assert due_in(waiting.id) <= 0 and no_waiters.waiting("sandbox_push") == []


@pytest.mark.django_db(transaction=True)
def test_a_waiter_its_own_timer_ran_meanwhile_is_left_to_its_next_rung(merchant, sandbox_rail, no_waiters):
    # Deferred, then run by its timer (another process freed the slot): it answered and now
    # waits for its next rung, its deferrals reset. A slot freed here must not ask early.
    ran, still = (known_charge(merchant, sandbox_rail, amount=5000) for _ in range(2))
    sql("UPDATE jobs SET run_at = now() + interval '30 seconds' WHERE dedupe_key = %s", [f"charge:poll:{ran.id}"])
    deferred(still.id)
    for charge in (ran, still):
        no_waiters.add("sandbox_push", f"charge:poll:{charge.id}")
    assert rail_slots.slot_freed("sandbox_push") == f"charge:poll:{still.id}"
    assert due_in(ran.id) > 25 and due_in(still.id) <= 0
