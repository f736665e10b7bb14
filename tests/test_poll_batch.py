"""Polls batched per rail (charges/services/poll_batch.py): a poll about to ask the rail
carries the merchant's other due polls on the same rail, holding their jobs, each with its
own request row committed before its GET; the answers go through the poll's own settlement
table. Through the shipping loop (``Worker.run_once``) or a real ``runworker``, against the
sandbox rail over HTTP."""

from __future__ import annotations

import signal

import pytest

from charges.models import Charge, PaymentIntent
from charges.rails import get_rail
from charges.rails.adapter import adapter_for
from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, apply_policy, scalar, sql, use_rails, worker_env
from tests.conftest import wait_for
from tests.killpoints_support import kill_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def merchant(settings, tmp_path, sandbox_rail):
    apply_policy(settings, FAST_POLICY)
    settings.VPAY_RAIL_POLL_BATCH = 8
    settings.VPAY_RAIL_MAX_IN_FLIGHT = 8
    use_rails(settings, tmp_path, sandbox_rail.rails())
    from merchants.services import create_merchant

    return create_merchant("Batch Ltd")[0]


def submitted(merchant, n: int, *, amount: int = 5000, rail: str = "sandbox_push") -> list[str]:
    """``n`` submitted charges the rail holds, each with a due poll job (as confirms leave them)."""
    ids = []
    for i in range(n):
        intent = PaymentIntent.objects.create(
            merchant=merchant, amount=amount + i, currency="usd", rail=rail, status="processing"
        )
        charge = Charge.objects.create(
            intent=intent,
            merchant=merchant,
            rail=rail,
            flow="push",
            amount=amount + i,
            currency="usd",
            status="submitted",
        )
        adapter_for(get_rail(rail)).submit(reference=charge.id, amount=charge.amount, currency="usd")
        enqueue(
            JobKind.POLL_CHARGE, {"charge_id": charge.id}, dedupe_key=f"charge:poll:{charge.id}", tenant=merchant.pk
        )
        ids.append(charge.id)
    return ids


def statuses() -> dict[str, int]:
    return dict(sql("SELECT status, count(*) FROM charges GROUP BY status"))


def poll_jobs() -> int:
    return scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_charge'")


def test_one_poll_carries_a_batch_each_with_its_own_request_row_and_their_jobs_finish(merchant, sandbox_rail):
    ids = submitted(merchant, 11)
    assert Worker().run_once() == 1
    # The carrier and 7 carried (VPAY_RAIL_POLL_BATCH 8): each asked once, each settled.
    assert statuses() == {"succeeded": 8, "submitted": 3}
    assert poll_jobs() == 3
    rows = sql(
        "SELECT charge_id, count(*), count(answered_at) FROM provider_requests WHERE operation = 'status' GROUP BY 1"
    )
    assert len(rows) == 8 and all(n == 1 and answered == 1 for _, n, answered in rows)
    assert sum(len([r for r in sandbox_rail.requests(i) if r["method"] == "GET"]) for i in ids) == 8
    assert scalar("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'") == 8
    assert Worker().run_once() == 1
    assert statuses() == {"succeeded": 11} and poll_jobs() == 0


def test_a_carried_poll_that_finds_the_ceiling_full_is_given_back_to_its_own_job(merchant, settings):
    """One after another, a batch holds one slot of the ceiling; with none free (three
    requests of other charges unanswered, the ceiling 3), the carrier defers and every poll
    it held is due again at once, nothing asked."""
    from charges import request_log
    from charges.models import RequestOperation

    settings.VPAY_RAIL_MAX_IN_FLIGHT = 3
    ids = submitted(merchant, 6)
    sql("UPDATE jobs SET priority = 1 WHERE payload->>'charge_id' = ANY(%s)", [ids[:3]])
    for charge_id in ids[:3]:
        request_log.record_sent(
            charge_id,
            RequestOperation.STATUS,
            rail="sandbox_push",
            method="GET",
            path="/x",
            idempotency_key=None,
            refund_id=None,
        )
    assert Worker().run_once() == 1
    assert statuses() == {"submitted": 6}
    assert scalar("SELECT count(*) FROM provider_requests") == 3
    # The carrier deferred (waits for a slot); the two it held are due again, not held.
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now() AND locked_at IS NULL AND priority = 0") == 2


def test_a_carried_charge_still_pending_waits_for_its_next_rung(merchant, sandbox_rail):
    ids = submitted(merchant, 3, amount=7000)
    for charge_id in ids:
        sandbox_rail.scenario(reference=charge_id, after_polls=5)
    assert Worker().run_once() == 1
    assert statuses() == {"submitted": 3}
    # Every job, the carried ones included, waits for its next rung (FAST_POLICY's ladder),
    # not the hold's 50 s.
    waits = [w for (w,) in sql("SELECT extract(epoch FROM run_at - now())::float8 FROM jobs")]
    assert len(waits) == 3 and all(0 < w < 10 for w in waits), waits


def test_only_the_same_merchants_polls_on_the_same_rail_ride_along(merchant, settings, sandbox_rail):
    from merchants.services import create_merchant

    submitted(merchant, 2)
    other = create_merchant("Other Ltd")[0]
    submitted(other, 2, amount=8000)
    submitted(merchant, 2, amount=9000, rail="sandbox_redirect")
    sql("UPDATE jobs SET priority = 1 WHERE payload->>'charge_id' NOT IN (SELECT id FROM charges WHERE amount < 6000)")
    assert Worker().run_once() == 1
    assert dict(sql("SELECT amount < 6000, count(*) FROM charges WHERE status = 'succeeded' GROUP BY 1")) == {True: 2}
    # Nothing else was asked about or held: the others' jobs are due, as they were.
    assert scalar("SELECT count(*) FROM provider_requests") == 2
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now() AND locked_at IS NULL") == 4


def test_a_batch_of_one_when_the_setting_says_so(merchant, settings):
    settings.VPAY_RAIL_POLL_BATCH = 1
    submitted(merchant, 3)
    assert Worker().run_once() == 1
    assert statuses() == {"succeeded": 1, "submitted": 2}


@pytest.mark.slow
def test_a_worker_killed_mid_batch_leaves_every_carried_poll_to_a_replacement(
    merchant, settings, tmp_path, sandbox_rail, start_worker
):
    """SIGKILL at the first carried answer (its request row committed, the rail answered,
    nothing of it recorded): each carried job runs when its hold ends, and every charge
    settles once, with one event."""
    ids = submitted(merchant, 10)
    for charge_id in ids:
        sandbox_rail.scenario(reference=charge_id, poll_delay=0.2)
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    env = {**worker_env(rails_file, FAST_POLICY), "VPAY_RAIL_TIMEOUT_SECONDS": "1"}
    doomed = start_worker("--concurrency", "4", env={**env, **kill_env(tmp_path, "rail.answered@status:2")})
    assert doomed.proc.wait(timeout=60) == -signal.SIGKILL, doomed.output()[-2000:]
    assert scalar("SELECT count(*) FROM provider_requests WHERE answered_at IS NULL") >= 1
    start_worker("--concurrency", "4", env={**env, **kill_env(tmp_path, None)})
    wait_for(lambda: statuses() == {"succeeded": 10}, timeout=90, message="every charge settled")
    assert scalar("SELECT count(*) FROM events WHERE type = 'payment_intent.succeeded'") == 10
    assert scalar("SELECT count(DISTINCT data->>'id') FROM events WHERE type = 'payment_intent.succeeded'") == 10
    wait_for(lambda: poll_jobs() == 0, timeout=30, message="every poll job finished")


def test_a_breaker_that_opens_mid_batch_stops_it_and_gives_the_rest_back(merchant, settings, sandbox_rail):
    """Each carried request asks the rail's breaker, as a lone poll's does: two failures open
    it (the carrier's own and the first carried), and the rest are not sent."""
    settings.VPAY_RAIL_BREAKER_FAILURES = 2
    ids = submitted(merchant, 6)
    for charge_id in ids:
        sandbox_rail.scenario(reference=charge_id, error_polls=-1)
    assert Worker().run_once() == 1
    assert scalar("SELECT count(*) FROM provider_requests") == 2
    assert scalar("SELECT state FROM breakers WHERE name LIKE '%%sandbox_push%%'") == "open"
    # The four it held and did not send are due again at once, on their own jobs.
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now() AND locked_at IS NULL") == 4


def test_the_first_carried_non_answer_ends_the_batch_even_with_the_breaker_closed(merchant, settings, sandbox_rail):
    settings.VPAY_RAIL_BREAKER_FAILURES = 100
    ids = submitted(merchant, 6)
    for charge_id in ids:
        sandbox_rail.scenario(reference=charge_id, error_polls=-1)
    assert Worker().run_once() == 1
    assert scalar("SELECT count(*) FROM provider_requests") == 2  # the carrier's own and one carried
    # The carried one that failed waits for its next rung, as a lone poll would; the four
    # after it are due again at once, on their own jobs.
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now() AND locked_at IS NULL") == 4
    assert scalar("SELECT count(*) FROM jobs WHERE run_at > now()") == 2


def test_a_charge_within_the_hold_of_its_horizon_is_not_carried(merchant, settings):
    """Past its horizon a poll escalates alone; a carried poll is judged on the age read
    before the batch, so one that could cross the horizon while the batch runs (its age plus
    the hold) is given back, to its own job."""
    ids = submitted(merchant, 3)
    sql("UPDATE jobs SET priority = 1 WHERE payload->>'charge_id' <> %s", [ids[0]])  # ids[0] carries
    # FAST_POLICY's horizon is an hour; the hold is 2 x its 1 s rail timeout + 10 s = 12 s.
    sql("UPDATE charges SET created_at = now() - interval '3594 seconds' WHERE id = %s", [ids[1]])
    assert Worker().run_once() == 1
    assert dict(sql("SELECT id, status FROM charges")) == {
        ids[0]: "succeeded",
        ids[1]: "submitted",
        ids[2]: "succeeded",
    }
    assert scalar("SELECT count(*) FROM jobs WHERE payload->>'charge_id' = %s AND run_at <= now()", [ids[1]]) == 1


def test_each_carried_answer_hands_its_slot_to_the_next_request_in_the_same_statement(merchant):
    """After the carrier's request (admitted by the ceiling, under the rail's lock), each
    answer and the next request's row are one statement in the transaction that settles the
    answered charge: the count in flight never moves, so no lock is taken. The new row is
    sent at the instant its predecessor was answered; every row ends answered."""
    submitted(merchant, 8)
    assert Worker().run_once() == 1
    assert statuses() == {"succeeded": 8}
    rows = sql("SELECT sent_at, answered_at FROM provider_requests WHERE operation = 'status' ORDER BY id")
    assert len(rows) == 8 and all(answered is not None for _, answered in rows)
    handed_over = [rows[k][0] == rows[k - 1][1] for k in range(1, 8)]
    assert handed_over == [True] * 7


def test_a_carried_settlement_that_fails_records_its_answer_alone_and_the_batch_goes_on(merchant, monkeypatch):
    """The answer rides in its charge's settlement; when that transaction fails, the answer
    is recorded on its own (the row is evidence, and its slot frees now, not at the bound),
    the poll goes back to its own job, and the next request is admitted by the ceiling."""
    from charges import settlement_writes

    ids = submitted(merchant, 5)
    sql("UPDATE jobs SET priority = 1 WHERE payload->>'charge_id' <> %s", [ids[0]])  # ids[0] carries
    settle = settlement_writes.settle_charge_and_intent
    calls: list[str] = []

    def second_carried_fails(charge_id, *args, **kwargs):
        calls.append(charge_id)
        if len(calls) == 3:  # the carrier's, the first carried's, then this one
            raise RuntimeError("the settlement failed")
        return settle(charge_id, *args, **kwargs)

    monkeypatch.setattr(settlement_writes, "settle_charge_and_intent", second_carried_fails)
    assert Worker().run_once() == 1
    failed = calls[2]
    assert statuses() == {"succeeded": 4, "submitted": 1}
    assert scalar("SELECT status FROM charges WHERE id = %s", [failed]) == "submitted"
    assert scalar("SELECT count(*) FROM provider_requests WHERE answered_at IS NULL") == 0
    assert scalar("SELECT count(*) FROM jobs WHERE payload->>'charge_id' = %s AND run_at <= now()", [failed]) == 1
    rows = sql("SELECT charge_id, sent_at, answered_at FROM provider_requests ORDER BY id")
    after = next(k for k, row in enumerate(rows) if row[0] == failed) + 1
    assert rows[after][1] != rows[after - 1][2]  # not handed over: through the ceiling


def test_a_lone_polls_settlement_that_fails_leaves_its_answer_recorded_and_the_job_to_retry(
    merchant, settings, monkeypatch
):
    from charges import settlement_writes

    settings.VPAY_RAIL_POLL_BATCH = 1

    def fails(*args, **kwargs):
        raise RuntimeError("the settlement failed")

    monkeypatch.setattr(settlement_writes, "settle_charge_and_intent", fails)
    [charge_id] = submitted(merchant, 1)
    assert Worker().run_once() == 1
    assert statuses() == {"submitted": 1}
    assert sql("SELECT status_code, rail_status FROM provider_requests") == [(200, "succeeded")]
    assert scalar("SELECT attempts FROM jobs WHERE payload->>'charge_id' = %s", [charge_id]) == 1


def test_a_batch_on_a_slow_rail_stops_carrying_after_its_time_and_gives_the_rest_back(
    merchant, sandbox_rail, monkeypatch
):
    """Its requests are serial: past BATCH_SECONDS it sends no more, and the polls it held
    go back to their own jobs (due now), for other executors to run beside it."""
    from charges.services import poll_batch

    monkeypatch.setattr(poll_batch, "BATCH_SECONDS", 0.3)
    ids = submitted(merchant, 6)
    for charge_id in ids:
        sandbox_rail.scenario(reference=charge_id, poll_delay=0.15)
    assert Worker().run_once() == 1
    asked = scalar("SELECT count(*) FROM provider_requests WHERE operation = 'status'")
    assert 2 <= asked <= 4, asked  # the carrier's, then carried ones while within 0.3 s
    assert statuses() == {"succeeded": asked, "submitted": 6 - asked}
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now() AND locked_at IS NULL") == 6 - asked
