"""The breaker primitive (``jobs.primitives.breakers``): its pure decision tables cell by cell, then the
shared state in PostgreSQL under real concurrent connections, on the database clock."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.db import connection

from jobs.models import Breaker, BreakerState
from jobs.primitives import breakers
from jobs.primitives.breakers import Admission, BreakerOpen, Limits, Transition, Verdict, admission, after_result

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
LIMITS = Limits(failures=3, cool_down=10.0, probe_lease=4.0)


# --- admission: every state, each side of its deadline ---------------------------------------


@pytest.mark.parametrize(
    ("state", "opened_age", "probe_age", "expected"),
    [
        (CLOSED, None, None, Admission(Verdict.ALLOW)),
        (CLOSED, 999.0, None, Admission(Verdict.ALLOW)),  # a stale opened_at means nothing when closed
        (OPEN, 0.0, None, Admission(Verdict.DEFER, 10.0)),
        (OPEN, 7.5, None, Admission(Verdict.DEFER, 2.5)),
        (OPEN, 10.0, None, Admission(Verdict.PROBE)),  # the cool-down is over at exactly its length
        (OPEN, 500.0, None, Admission(Verdict.PROBE)),
        (HALF, 50.0, 0.0, Admission(Verdict.DEFER, 4.0)),  # a probe is out: everyone else waits for it
        (HALF, 50.0, 3.0, Admission(Verdict.DEFER, 1.0)),
        (HALF, 50.0, 4.0, Admission(Verdict.PROBE)),  # the probe's lease ran out: its worker died
        (HALF, 50.0, 60.0, Admission(Verdict.PROBE)),
    ],
)
def test_admission_lets_a_call_through_when_closed_probes_after_the_cool_down_and_defers_otherwise(
    state, opened_age, probe_age, expected
):
    assert admission(state, opened_age, probe_age, LIMITS) == expected


# --- after_result: every state x probe x answer, each side of the threshold -------------------

EXPECTED = {
    # (state, failures, probe, ok): Transition | None
    (CLOSED, 0, False, True): None,  # the hot path writes nothing
    (CLOSED, 1, False, True): Transition(CLOSED, 0),  # any answer resets the consecutive count
    (CLOSED, 0, False, False): Transition(CLOSED, 1),
    (CLOSED, 1, False, False): Transition(CLOSED, 2),
    (CLOSED, 2, False, False): Transition(OPEN, 3, opened=True),  # the third in a row opens it
    (OPEN, 3, False, True): None,  # a late success does not close it: the probe decides
    (OPEN, 3, False, False): Transition(OPEN, 4, keep_probe=True),  # counted; the cool-down is not restarted
    (HALF, 3, True, True): Transition(CLOSED, 0),  # the probe answered: closed
    (HALF, 3, True, False): Transition(OPEN, 4, opened=True),  # the probe failed: a new cool-down
    (HALF, 3, False, True): None,  # someone else's late answer: the probe decides
    (HALF, 3, False, False): Transition(HALF, 4, keep_probe=True),  # counted, the probe is still out
}


@pytest.mark.parametrize(("cell", "expected"), list(EXPECTED.items()), ids=[str(c) for c in EXPECTED])
def test_after_result_opens_on_consecutive_failures_and_only_the_probe_closes_or_reopens(cell, expected):
    state, failures, probe, ok = cell
    assert after_result(state, failures, probe=probe, ok=ok, limits=LIMITS) == expected


def test_the_after_result_table_covers_every_state_probe_and_answer():
    covered = {(s, p, ok) for s, _, p, ok in EXPECTED}
    reachable = {(s, p, ok) for s, p, ok in itertools.product(BreakerState, (False, True), (False, True))}
    reachable -= {(CLOSED, True, ok) for ok in (False, True)} | {(OPEN, True, ok) for ok in (False, True)}
    assert covered == reachable  # a probe exists only on a half-open breaker


def test_limits_refuse_a_breaker_that_could_never_open_or_never_close():
    for bad in ((0, 1.0, 1.0), (1, 0.0, 1.0), (1, 1.0, 0.0)):
        with pytest.raises(ValueError):
            Limits(*bad)


# --- shared state in PostgreSQL ---------------------------------------------------------------

FAST = Limits(failures=3, cool_down=0.4, probe_lease=0.4)


def row(name: str) -> Breaker | None:
    return Breaker.objects.filter(name=name).first()


def fail(name: str, limits: Limits = FAST, error: str = "timed out") -> None:
    breakers.failed(breakers.admit(name, limits), error)


def open_breaker(name: str, limits: Limits = FAST) -> None:
    for _ in range(limits.failures):
        fail(name, limits)
    assert row(name).state == OPEN


def in_threads(n: int, fn) -> list:
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i):
        try:
            barrier.wait(5)
            results[i] = fn()
        except BaseException as exc:  # the result under test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.django_db(transaction=True)
class TestSharedState:
    def test_a_breaker_that_never_failed_has_no_row_and_costs_one_read(self, django_assert_num_queries):
        with django_assert_num_queries(1):
            breakers.succeeded(breakers.admit("rail:quiet", FAST))
        assert row("rail:quiet") is None

    def test_consecutive_failures_open_it_and_an_answer_in_between_resets_the_count(self):
        fail("rail:a")
        fail("rail:a")
        breakers.succeeded(breakers.admit("rail:a", FAST))
        assert (row("rail:a").state, row("rail:a").failures) == (CLOSED, 0)
        fail("rail:a")
        fail("rail:a")
        assert row("rail:a").state == CLOSED
        fail("rail:a", error="timed out; Authorization: Bearer sk_live_abcdefabcdef")
        opened = row("rail:a")
        assert (opened.state, opened.failures) == (OPEN, 3) and opened.opened_at is not None
        assert "sk_live_abcdefabcdef" not in opened.last_error  # redacted before it is stored

    def test_an_open_breaker_refuses_calls_with_a_deferral_until_its_cool_down_ends(self):
        open_breaker("rail:b")
        with pytest.raises(BreakerOpen) as refused:
            breakers.admit("rail:b", FAST)
        assert refused.value.classification.retry.value == "defer"
        assert breakers.MIN_WAIT_SECONDS <= refused.value.delay_seconds <= breakers.MIN_WAIT_SECONDS * 1.25

    def test_after_the_cool_down_exactly_one_of_many_concurrent_callers_probes(self):
        open_breaker("rail:c")
        time.sleep(FAST.cool_down + 0.1)
        results = in_threads(8, lambda: breakers.admit("rail:c", FAST))
        probes = [r for r in results if isinstance(r, breakers.Ticket)]
        assert len(probes) == 1 and probes[0].probe
        assert all(isinstance(r, BreakerOpen) for r in results if r is not probes[0])
        assert row("rail:c").state == HALF and row("rail:c").probe_token == probes[0].probe_token

    def test_a_probe_success_closes_the_breaker(self):
        open_breaker("rail:d")
        time.sleep(FAST.cool_down + 0.1)
        probe = breakers.admit("rail:d", FAST)
        breakers.succeeded(probe)
        closed = row("rail:d")
        assert (closed.state, closed.failures, closed.opened_at, closed.probe_token) == (CLOSED, 0, None, None)
        breakers.succeeded(breakers.admit("rail:d", FAST))  # calls go through again

    def test_a_probe_failure_reopens_it_for_a_new_cool_down(self):
        open_breaker("rail:e")
        first_opened = row("rail:e").opened_at
        time.sleep(FAST.cool_down + 0.1)
        breakers.failed(breakers.admit("rail:e", FAST), "503")
        reopened = row("rail:e")
        assert reopened.state == OPEN and reopened.opened_at > first_opened and reopened.probe_token is None
        with pytest.raises(BreakerOpen):
            breakers.admit("rail:e", FAST)

    def test_a_late_success_of_a_call_admitted_before_the_opening_does_not_close_it(self):
        early = breakers.admit("rail:f", FAST)
        open_breaker("rail:f")
        breakers.succeeded(early)
        assert row("rail:f").state == OPEN

    def test_a_probe_whose_worker_died_is_replaced_after_the_probe_lease(self):
        open_breaker("rail:g")
        time.sleep(FAST.cool_down + 0.1)
        lost = breakers.admit("rail:g", FAST)  # never reports: its worker was killed
        with pytest.raises(BreakerOpen):
            breakers.admit("rail:g", FAST)
        time.sleep(FAST.probe_lease + 0.1)
        second = breakers.admit("rail:g", FAST)
        assert second.probe and second.probe_token != lost.probe_token
        breakers.succeeded(lost)  # the lost probe's late answer is no longer the probe's
        assert row("rail:g").state == HALF
        breakers.succeeded(second)
        assert row("rail:g").state == CLOSED

    def test_a_probe_that_was_never_sent_hands_its_turn_to_the_next_caller_at_once(self):
        open_breaker("rail:h")
        time.sleep(FAST.cool_down + 0.1)
        breakers.release(breakers.admit("rail:h", FAST))
        assert row("rail:h").state == OPEN
        assert breakers.admit("rail:h", FAST).probe  # no probe lease to sit out

    def test_concurrent_failures_are_all_counted(self):
        limits = Limits(failures=100, cool_down=1.0, probe_lease=1.0)
        in_threads(6, lambda: fail("rail:i", limits))
        assert row("rail:i").failures == 6

    def test_cool_downs_are_measured_on_the_database_clock(self):
        open_breaker("rail:j", Limits(failures=3, cool_down=3600.0, probe_lease=60.0))
        with connection.cursor() as cursor:  # opened an hour ago by the database's clock
            cursor.execute("UPDATE breakers SET opened_at = now() - interval '3601 seconds' WHERE name = 'rail:j'")
        assert breakers.admit("rail:j", Limits(failures=3, cool_down=3600.0, probe_lease=60.0)).probe
