"""A resend is no first send: what the rail answers to the same reference sent again proves
nothing about the money, because the lost first send may have landed (issue 23, items 1
and 2). A refusal of a resent charge or refund, or a resent refund answered ``failed``, is a
non-answer: the object stays live, its poll asks the rail, and a later success settles it.

End to end with real worker processes and the sandbox rail losing the first answer; and, in
process, the race the resend decision must survive: a run that read "never sent" while
another run's send was going out is resending, which only the statement that records the
request can know (the per-rail lock it takes serializes it after the other's insert)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection

from charges.models import Charge, PaymentIntent
from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, apply_policy, charge_of, events, scalar, sql, use_rails, worker_env
from tests.conftest import database_url, wait_for
from tests.refund_support import RefundingMerchant, amount_refunded

pytestmark = pytest.mark.django_db(transaction=True)

POLICY = {
    **FAST_POLICY,
    "VPAY_REFUND_POLL_LADDER_SECONDS": "0.05,0.1,0.1,0.2",
    "VPAY_REFUND_HORIZON_SECONDS": 3600.0,
}
FOREVER = 1_000_000  # polls the rail answers 404 (it holds the object all the same)


@pytest.fixture
def stack(settings, tmp_path, sandbox_rail, start_worker):
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    apply_policy(settings, POLICY)

    class Stack:
        rail = sandbox_rail
        acme = RefundingMerchant("Acme")

        def worker(self):
            return start_worker("--concurrency", "2", env=worker_env(rails_file, POLICY))

        def requests(self, reference: str, method: str) -> list[dict]:
            return [r for r in self.rail.requests(reference) if r["method"] == method]

        def asked_after_resend(self, reference: str) -> bool:
            """The rail got the resend, then a status read: the poll went on asking."""
            log = self.rail.requests(reference)
            posts = [i for i, r in enumerate(log) if r["method"] == "POST"]
            return len(posts) >= 2 and any(r["method"] == "GET" for r in log[posts[1] + 1 :])

    return Stack()


def status_of(table: str, object_id: str) -> str:
    return scalar(f"SELECT status FROM {table} WHERE id = %s", [object_id])


@pytest.mark.slow
def test_a_charge_whose_resubmit_the_rail_refuses_stays_live_and_its_later_success_is_recorded(stack):
    # The rail takes the submit and loses its answer, then says 404 about the charge for as
    # long as the test lets it, and refuses the same reference sent again (a 422, not the
    # 409 "still processing" the adapter reads as transient).
    stack.rail.scenario(amount=4101, drop_submits=1, not_found_polls=FOREVER)
    stack.worker()
    intent = stack.acme.confirm(stack.acme.intent(amount=4101)["id"])
    charge_id = intent["charge"]["id"]
    assert intent["charge"]["status"] == "submitting"
    stack.rail.scenario(reference=charge_id, submit_status=422, submit_records=True, not_found_polls=FOREVER)
    wait_for(lambda: stack.asked_after_resend(charge_id), 30, message="a refused resubmit, then a status read")
    assert [p["status"] for p in stack.requests(charge_id, "POST")][:2] == [None, 422]
    assert status_of("charges", charge_id) == "submitting"  # not failed: the rail holds it
    assert status_of("payment_intents", intent["id"]) == "processing"
    # The rail settles it: the poll, still asking, records the success.
    stack.rail.scenario(reference=charge_id)
    wait_for(lambda: status_of("charges", charge_id) == "succeeded", 30, message="the charge succeeded")
    assert [t for t, _ in events(intent["id"])] == ["payment_intent.succeeded"]
    assert scalar("SELECT count(*) FROM dead_letters") == 0


@pytest.mark.slow
def test_a_refund_resend_answered_failed_keeps_the_amount_held_and_its_later_success_is_recorded(stack):
    stack.worker()
    intent = stack.acme.confirm(stack.acme.intent(amount=6101)["id"])
    wait_for(lambda: status_of("payment_intents", intent["id"]) == "succeeded", 30, message="paid")
    # The rail takes the refund and loses the answer, says 404 about it, and answers the
    # resend 200 {"status": "failed"} (its own idea of a duplicate).
    stack.rail.scenario(
        amount=6101,
        drop_submits=1,
        not_found_polls=FOREVER,
        submit_body='{"status": "failed", "failure_code": "duplicate_reference"}',
    )
    refund = stack.acme.refund(intent["id"]).json()["id"]
    wait_for(lambda: stack.asked_after_resend(refund), 30, message="a resend answered failed, then a status read")
    assert status_of("refunds", refund) in ("submitting", "pending")  # not failed
    assert amount_refunded(intent["id"]) == 6101  # not given back
    # So the payer cannot be refunded twice.
    again = stack.acme.refund(intent["id"])
    assert again.status_code == 400 and again.json()["error"]["code"] == "charge_already_refunded"
    stack.rail.scenario(reference=refund)
    wait_for(lambda: status_of("refunds", refund) == "succeeded", 30, message="the refund succeeded")
    assert [t for t, _ in events(refund) if t.startswith("refund.")] == ["refund.succeeded"]
    (held,) = stack.rail._get(f"/__admin/refunds?charge_reference={intent['charge']['id']}")["refunds"]
    assert (held["reference"], held["submits"]) == (refund, 2)


# --- the decision is the recording statement's ---------------------------------------------


def _run_while_another_send_is_recorded(*, charge_id: str, refund_id: str | None) -> None:
    """Run the one due job while, between its read of the object ("never sent") and its own
    request row, another run's send of the same reference is recorded: a real second
    connection holds the rail's lock, and inserts that row while the job waits on it."""
    ran: list[int] = []

    def run() -> None:
        try:
            ran.append(Worker(worker_id="w-race").run_once())
        finally:
            connection.close()

    operation = "refund_submit" if refund_id else "submit"
    path = "/refunds" if refund_id else "/charges"
    with psycopg.connect(database_url()) as other, psycopg.connect(database_url(), autocommit=True) as watch:
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended('vpay:rail_in_flight:' || 'sandbox_push', 0))")
        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 10
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the job never reached the statement recording its send"
            time.sleep(0.02)
        other.execute(
            "INSERT INTO provider_requests (charge_id, refund_id, operation, rail, method, path, idempotency_key,"
            " sent_at, error, response_excerpt) VALUES (%s, %s, %s, 'sandbox_push', 'POST', %s, %s, now(), '', '')",
            [charge_id, refund_id, operation, path, refund_id or charge_id],
        )
        other.commit()  # the other send is on its way; the lock goes with the commit
        worker.join(15)
    assert ran == [1]


def test_a_refund_resend_found_by_the_recording_statement_is_not_failed_by_a_failed_answer(
    settings, tmp_path, sandbox_rail
):
    use_rails(settings, tmp_path, sandbox_rail.rails())
    apply_policy(settings, POLICY)
    acme = RefundingMerchant("Acme")
    intent = acme.paid_intent(amount=5000)
    refund = acme.refund(intent, amount=2000).json()["id"]
    sandbox_rail.scenario(reference=refund, submit_body='{"status": "failed", "failure_code": "duplicate_reference"}')
    sql("DELETE FROM jobs WHERE kind <> 'poll_refund'")  # the refund's poll alone
    time.sleep(0.1)
    _run_while_another_send_is_recorded(charge_id=charge_of(intent)["id"], refund_id=refund)
    assert status_of("refunds", refund) == "submitting"
    assert amount_refunded(intent) == 2000
    assert [t for t, _ in events(refund)] == []
    # Its poll lives on, and asks the rail next.
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_refund' AND last_error LIKE '%%unavailable%%'") == 1


def test_a_resubmit_found_to_be_a_resend_by_the_recording_statement_is_not_failed_by_a_refusal(
    settings, tmp_path, sandbox_rail
):
    use_rails(settings, tmp_path, sandbox_rail.rails())
    apply_policy(settings, POLICY)
    from merchants.services import create_merchant

    merchant = create_merchant("Race Ltd")[0]
    intent = PaymentIntent.objects.create(
        merchant=merchant, amount=5000, currency="usd", rail="sandbox_push", status="processing"
    )
    charge = Charge.objects.create(
        intent=intent, merchant=merchant, rail="sandbox_push", flow="push", amount=5000, currency="usd"
    )
    sql(
        "UPDATE charges SET not_found_count = 3, first_not_found_at = now() - interval '1 day' WHERE id = %s",
        [charge.id],
    )
    sandbox_rail.scenario(reference=charge.id, submit_status=422)
    enqueue(JobKind.RESUBMIT_CHARGE, {"charge_id": charge.id}, dedupe_key=f"charge:resubmit:{charge.id}")
    _run_while_another_send_is_recorded(charge_id=charge.id, refund_id=None)
    assert [r["status"] for r in sandbox_rail.requests(charge.id) if r["method"] == "POST"] == [422]
    got = charge_of(intent.id)
    assert (got["status"], got["failure_code"]) == ("submitting", None)
    assert status_of("payment_intents", intent.id) == "processing" and events(intent.id) == []
    # The streak that sent it is forgotten: its poll asks the rail next, it does not resend.
    assert got["not_found_count"] == 0
