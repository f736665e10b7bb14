"""One poll at a time: the shipping worker loop run in-process (``Worker.run_once``) over
charges in chosen states, against the sandbox rail over HTTP. Where the subprocess tests
show that charges settle, these pin what each single pass wrote and how long it parked."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from charges.models import Charge, PaymentIntent
from charges.rails import get_rail
from charges.rails.adapter import adapter_for
from charges.services import backstop_scan, polling
from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.models import DeadLetter
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, apply_policy, charge_of, events, scalar, sql, use_rails
from tests.conftest import database_url
from vpay import sealing

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = 30.0


@pytest.fixture
def merchant(settings, tmp_path, sandbox_rail):
    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS": WINDOW})
    use_rails(settings, tmp_path, sandbox_rail.rails())
    from merchants.services import create_merchant

    return create_merchant("Poll Ltd")[0]


def live_charge(merchant, *, status="submitting", flow="push", amount=5000, age=0.0, job=True) -> Charge:
    rail = "sandbox_push" if flow == "push" else "sandbox_redirect"
    intent = PaymentIntent.objects.create(
        merchant=merchant, amount=amount, currency="usd", rail=rail, status="processing"
    )
    charge = Charge.objects.create(
        intent=intent, merchant=merchant, rail=rail, flow=flow, amount=amount, currency="usd", status=status
    )
    if age:
        sql("UPDATE charges SET created_at = now() - make_interval(secs => %s) WHERE id = %s", [age, charge.id])
    if job:
        enqueue(JobKind.POLL_CHARGE, {"charge_id": charge.id}, dedupe_key=f"charge:poll:{charge.id}")
    return charge


def job_of(charge_id: str) -> tuple[float, str] | None:
    rows = sql(
        "SELECT extract(epoch FROM run_at - now())::float8, last_error FROM jobs WHERE dedupe_key = %s",
        [f"charge:poll:{charge_id}"],
    )
    return rows[0] if rows else None


def test_a_young_submitting_charge_waits_once_for_exactly_the_rest_of_the_window(merchant, sandbox_rail):
    charge = live_charge(merchant, age=10.0)
    assert Worker().run_once() == 1
    due_in, reason = job_of(charge.id)
    # 30 s window - 10 s of age + the 0.05 s margin: once, not a rung of the ladder.
    assert 19.5 < due_in <= 20.1 and "waiting" in reason
    assert charge_of(charge.intent_id)["status"] == "submitting"
    assert scalar("SELECT count(*) FROM provider_requests WHERE charge_id = %s", [charge.id]) == 0
    assert sandbox_rail.requests(charge.id) == []  # the rail was asked nothing
    # When it comes back it is old enough: the next pass is the real recovery (never sent -> resubmit).
    sql("UPDATE charges SET created_at = created_at - interval '20 seconds' WHERE id = %s", [charge.id])
    sql("UPDATE jobs SET run_at = now()")
    assert Worker().run_once() == 1
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'resubmit_charge'") == 1


def test_a_charge_whose_created_at_leads_the_database_clock_waits_one_window_not_one_skew(merchant):
    charge = live_charge(merchant, age=-3600.0)
    Worker().run_once()
    due_in, _ = job_of(charge.id)
    assert WINDOW - 0.5 < due_in <= WINDOW + 0.1


def test_a_terminal_charges_poll_is_a_no_op(merchant, sandbox_rail):
    charge = live_charge(merchant, status="succeeded")
    Worker().run_once()
    assert job_of(charge.id) is None and sandbox_rail.requests(charge.id) == []


def test_refused_credentials_on_a_poll_dead_letter_the_job_as_configuration(merchant, settings, tmp_path, sandbox_rail):
    rails = sandbox_rail.rails()
    rails["sandbox_push"]["api_key"] = "wrong-key"
    use_rails(settings, tmp_path, rails)
    charge = live_charge(merchant, status="submitted")
    Worker().run_once()
    dead = DeadLetter.objects.get()
    assert dead.cause == "configuration" and dead.payload == {"charge_id": charge.id}
    assert "wrong-key" not in dead.last_error
    assert charge_of(charge.intent_id)["status"] == "submitted"
    code, answered = sql(
        "SELECT status_code, answered_at IS NOT NULL FROM provider_requests WHERE charge_id = %s", [charge.id]
    )[0]
    assert (code, answered) == (401, True)


def test_past_the_horizon_a_refused_poll_escalates_instead_of_dead_lettering(
    merchant, settings, tmp_path, sandbox_rail
):
    rails = sandbox_rail.rails()
    rails["sandbox_push"]["api_key"] = "wrong-key"
    use_rails(settings, tmp_path, rails)
    charge = live_charge(merchant, status="submitted", age=3600.0 * 2)
    settings.VPAY_CHARGE_HORIZON_SECONDS = 3600.0
    Worker().run_once()
    assert DeadLetter.objects.count() == 0
    assert charge_of(charge.intent_id)["status"] == "unresolved"
    assert [t for t, _ in events(charge.id)] == ["charge.unresolved"]
    due_in, _ = job_of(charge.id)
    assert due_in == pytest.approx(0.5, abs=0.2)  # the past-horizon period (hourly by default)


def test_a_404_about_a_submitting_charge_is_recorded_as_evidence(merchant):
    charge = live_charge(merchant, age=WINDOW + 1)
    # A submit that went out and was never answered: recovery asks the rail, which does not know it.
    sql(
        "INSERT INTO provider_requests (charge_id, operation, rail, method, path, idempotency_key, sent_at, error, response_excerpt)"
        " VALUES (%s, 'submit', 'sandbox_push', 'POST', '/charges', %s, now(), '', '')",
        [charge.id, charge.id],
    )
    Worker().run_once()
    count, first_seen = sql(
        "SELECT not_found_count, first_not_found_at IS NOT NULL FROM charges WHERE id = %s", [charge.id]
    )[0]
    assert (count, first_seen) == (1, True)
    due_in, reason = job_of(charge.id)
    assert "not_found" in reason and due_in == pytest.approx(0.05, abs=0.2)  # the first rung


def test_the_backstop_restores_lost_polls_page_by_page_and_leaves_live_ones_alone(merchant, monkeypatch):
    monkeypatch.setattr(backstop_scan, "SCAN_PAGE", 2)
    lost = [live_charge(merchant, status="submitted", amount=6000 + i, job=False) for i in range(5)]
    kept = live_charge(merchant, status="unresolved", amount=6100)
    sql("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE dedupe_key = %s", [f"charge:poll:{kept.id}"])
    live_charge(merchant, status="failed", amount=6200, job=False)  # not live: no poll
    enqueue(JobKind.SCAN_LIVE_CHARGES, {}, dedupe_key="singleton:scan_live_charges")
    assert Worker().run_once() == 1
    restored = {
        r[0] for r in sql("SELECT payload->>'charge_id' FROM jobs WHERE kind = 'poll_charge' AND run_at <= now()")
    }
    assert restored == {c.id for c in lost}
    assert job_of(kept.id)[0] > 3000  # its live job untouched
    # The scan rescheduled itself for the next pass.
    assert scalar("SELECT extract(epoch FROM run_at - now()) > 500 FROM jobs WHERE kind = 'scan_live_charges'")


def test_the_backstop_reports_only_the_polls_that_were_lost_not_a_charge_settled_behind_its_read(
    merchant, monkeypatch, caplog
):
    """A charge settles, and its poll finishes, between the page's read and its insert: the
    insert finds no conflict and gives it a poll (which will find it settled and end). That is
    no lost poll, and the warning an operator reads counts only the live charge that had none."""
    from charges import repository

    lost = live_charge(merchant, status="submitted", amount=6400, job=False)
    settling = live_charge(merchant, status="submitted", amount=6401, job=False)  # its poll just finished
    read = repository.live_page

    def read_then_settle(after, limit):
        page = read(after, limit)
        sql("UPDATE charges SET status = 'succeeded' WHERE id = %s", [settling.id])
        return page

    monkeypatch.setattr(repository, "live_page", read_then_settle)
    enqueue(JobKind.SCAN_LIVE_CHARGES, {}, dedupe_key="singleton:scan_live_charges")
    with caplog.at_level("WARNING", logger="charges.services.polling"):
        assert Worker().run_once() == 1
    assert polls() == {lost.id, settling.id}  # both inserted: the page said both were live
    warned = [r for r in caplog.records if "backstop re-enqueued" in r.getMessage()]
    assert [r.count for r in warned] == [1]


def test_a_dead_order_check_that_loses_the_race_to_the_confirm_keeps_the_only_poll_job(merchant):
    """A redirect charge past the window, in submitting: the poll concludes FailDeadOrder.
    A real second connection holds the charge's row and, while the poll's guarded write
    waits on it, commits the confirm's compare-and-swap (submitting -> submitted, the URL
    handed out). The poll's write then matches nothing, and the job must survive: the
    confirm's pull-forward found it leased, so it is the only thing that will ever poll."""
    charge = live_charge(merchant, flow="redirect", age=WINDOW + 5)
    ran: list = []

    def poll():
        try:
            ran.append(Worker().run_once())
        finally:
            connection.close()

    with psycopg.connect(database_url()) as confirm, psycopg.connect(database_url(), autocommit=True) as watch:
        confirm.execute("SELECT 1 FROM charges WHERE id = %s FOR UPDATE", [charge.id])
        worker = threading.Thread(target=poll)
        worker.start()
        deadline = time.monotonic() + 10
        # Until the poll's guarded UPDATE waits on our row lock (watched from a connection
        # outside any transaction: pg_stat_activity is a snapshot within one).
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%UPDATE \"charges\" SET \"status\"%'"
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the poll never reached its guarded write"
            time.sleep(0.02)
        confirm.execute(
            "UPDATE charges SET status = 'submitted', pay_token = %s, redirect_url = %s WHERE id = %s",
            [
                sealing.seal_text("tok", sealing.bound("charges", "pay_token", charge.id)),
                sealing.seal_text("https://psp.example/pay/x", sealing.bound("charges", "redirect_url", charge.id)),
                charge.id,
            ],
        )
        confirm.commit()
        worker.join(15)
    assert ran == [1]
    assert charge_of(charge.intent_id)["status"] == "submitted"  # the live order was not failed
    assert scalar("SELECT status FROM payment_intents WHERE id = %s", [charge.intent_id]) == "processing"
    assert events(charge.id) == []
    due_in, reason = job_of(charge.id)  # the job survived, due now
    assert due_in <= 0.1 and "left submitting" in reason


def test_a_wait_that_finds_the_confirm_finished_runs_again_at_once(merchant):
    """The confirm's compare-and-swap commits while the poll holds its (young) charge: the
    pull-forward found the job leased. ``_wait`` looks once more before parking it."""
    from charges import repository
    from charges.policy import from_settings

    charge = live_charge(merchant, age=5.0, job=False)
    row = repository.read_for_poll(charge.id)  # what the poll read: submitting, young
    policy = from_settings()
    assert polling._wait(row, 20.0, policy).delay == pytest.approx(20.0 + policy.wait_margin)
    sql("UPDATE charges SET status = 'submitted' WHERE id = %s", [charge.id])  # the confirm commits
    outcome = polling._wait(row, 20.0, policy)
    assert outcome.delay == 0 and "confirm finished" in outcome.reason


def polls() -> set[str]:
    return {r[0] for r in sql("SELECT payload->>'charge_id' FROM jobs WHERE kind = 'poll_charge'")}


def scan_only() -> None:
    """Run the backstop alone: the polls it restored are pushed out of the worker's way."""
    sql("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE kind = 'poll_charge'")
    sql("UPDATE jobs SET run_at = now() WHERE kind = 'scan_live_charges'")
    assert Worker().run_once() == 1


def test_the_backstop_carries_its_place_across_passes_and_reaches_every_live_charge(merchant, monkeypatch):
    # Passes of two pages of two: seven lost polls take two passes, the second one at once.
    monkeypatch.setattr(backstop_scan, "SCAN_PAGE", 2)
    monkeypatch.setattr(backstop_scan, "SCAN_MAX_PAGES", 2)
    lost = sorted(
        (live_charge(merchant, status="submitted", amount=6300 + i, job=False) for i in range(7)), key=lambda c: c.id
    )
    enqueue(JobKind.SCAN_LIVE_CHARGES, {}, dedupe_key="singleton:scan_live_charges")
    assert Worker().run_once() == 1
    assert polls() == {c.id for c in lost[:4]}
    due_in, reason = sql(
        "SELECT extract(epoch FROM run_at - now())::float8, last_error FROM jobs WHERE kind = 'scan_live_charges'"
    )[0]
    assert due_in <= 0.1 and "continuing" in reason  # the rest of the table, at once
    scan_only()
    assert polls() == {c.id for c in lost}  # the second pass went on from the fourth
    assert scalar("SELECT extract(epoch FROM run_at - now()) > 500 FROM jobs WHERE kind = 'scan_live_charges'")
    # Having reached the end, the next pass starts again from the first id.
    sql("DELETE FROM jobs WHERE dedupe_key = %s", [f"charge:poll:{lost[0].id}"])
    scan_only()
    assert lost[0].id in polls()


def test_the_backstop_leaves_a_poll_awaiting_review_in_dead_letters_to_the_human(merchant):
    from tests.factories.jobs import DeadLetterFactory

    charge = live_charge(merchant, status="submitted", job=False)
    letter = DeadLetterFactory(
        kind="poll_charge",
        payload={"charge_id": charge.id},
        dedupe_key=f"charge:poll:{charge.id}",
        cause="permanent",
        error_category="permanent",
    )
    enqueue(JobKind.SCAN_LIVE_CHARGES, {}, dedupe_key="singleton:scan_live_charges")
    assert Worker().run_once() == 1
    assert charge.id not in polls()  # no poll -> dead letter -> backstop -> poll loop
    # Once a human has dealt with the letter (here: discarded it), the backstop restores the poll.
    sql(
        "UPDATE dead_letters SET state = 'discarded', discarded_at = now(), discarded_by = 'ops',"
        " discard_reason = 'rail fixed' WHERE id = %s",
        [letter.pk],
    )
    scan_only()
    assert charge.id in polls()


def test_a_resubmit_the_rail_refuses_for_good_fails_the_charge_and_the_intent_with_an_event(merchant, sandbox_rail):
    # Never sent and older than the window: recovery resubmits, and the rail refuses it (422).
    charge = live_charge(merchant, age=WINDOW + 5)
    sandbox_rail.scenario(reference=charge.id, submit_status=422)
    assert Worker().run_once() == 1
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'resubmit_charge'") == 1
    sql("UPDATE jobs SET run_at = now() + interval '1 hour' WHERE kind = 'poll_charge'")
    assert Worker().run_once() == 1
    got = charge_of(charge.intent_id)
    assert (got["status"], got["failure_code"]) == ("failed", "rail_rejected")
    assert scalar("SELECT status FROM payment_intents WHERE id = %s", [charge.intent_id]) == "failed"
    assert [t for t, _ in events(charge.intent_id)] == ["payment_intent.payment_failed"]
    posts = [r for r in sandbox_rail.requests(charge.id) if r["method"] == "POST"]
    assert [r["status"] for r in posts] == [422]
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'resubmit_charge'") == 0


@pytest.mark.parametrize("past", [False, True], ids=["before_the_horizon", "past_the_horizon"])
def test_a_status_read_the_rail_refuses_is_a_non_answer_never_a_dead_letter(merchant, sandbox_rail, settings, past):
    # A 4xx on a GET cannot refuse money for good: the charge's only poll takes its next
    # rung (past the horizon: escalation, its alert and the hourly poll), and asks again.
    settings.VPAY_CHARGE_HORIZON_SECONDS = 3600.0
    charge = live_charge(merchant, status="submitted", age=7200.0 if past else 0.0)
    sandbox_rail.scenario(reference=charge.id, error_polls=1, error_status=422)
    adapter_for(get_rail("sandbox_push")).submit(reference=charge.id, amount=charge.amount, currency="usd")
    assert Worker().run_once() == 1
    assert DeadLetter.objects.count() == 0
    assert sql("SELECT status_code FROM provider_requests WHERE charge_id = %s", [charge.id]) == [(422,)]
    due_in, reason = job_of(charge.id)
    assert ("unresolved" if past else "unavailable") in reason
    assert due_in == pytest.approx(0.5 if past else 0.05, abs=0.2)  # the past-horizon period, or the first rung
    assert charge_of(charge.intent_id)["status"] == ("unresolved" if past else "submitted")
    assert [t for t, _ in events(charge.id)] == (["charge.unresolved"] if past else [])
    if past:
        assert scalar("SELECT count(*) FROM alerts WHERE key LIKE %s", [f"charge_unresolved:{charge.id}:%"]) == 1
