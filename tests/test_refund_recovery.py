"""The refund poll's recovery rules, in process against the real sandbox rail: a resend the
rail refuses proves nothing (the refund stays live, its amount held), a refund escalated
before it was ever sent is still sent, and the charges backstop gives every live refund
its poll back."""

from __future__ import annotations

import time

import pytest

from charges import refund_repository
from charges.services.backstop_scan import _restore_refund_polls
from jobs.runner.worker import Worker
from tests.charges_support import FAST_POLICY, apply_policy, scalar, sql, use_rails
from tests.factories.jobs import DeadLetterFactory
from tests.refund_support import RefundingMerchant, amount_refunded

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def acme(settings, tmp_path, sandbox_rail):
    use_rails(settings, tmp_path, sandbox_rail.rails())
    apply_policy(
        settings, {**FAST_POLICY, "VPAY_REFUND_POLL_LADDER_SECONDS": "0.05", "VPAY_REFUND_HORIZON_SECONDS": 3600.0}
    )
    return RefundingMerchant("Acme")


def run_poll() -> None:
    """Run the refund's poll once (the paid intent's own charge jobs are not this test's)."""
    sql("DELETE FROM jobs WHERE kind <> 'poll_refund'")
    time.sleep(0.1)  # past the ladder's 0.05 s rung
    assert Worker(worker_id="w-refund").run_once() == 1


def posts(rail, refund_id: str) -> list[dict]:
    return [r for r in rail.requests(refund_id) if r["method"] == "POST"]


def test_a_resend_the_rail_refuses_is_no_failure_and_the_amount_stays_held(acme, sandbox_rail):
    intent = acme.paid_intent(amount=5000)
    refund = acme.refund(intent, amount=2000).json()["id"]
    run_poll()  # sent: the rail holds it, pending
    assert len(posts(sandbox_rail, refund)) == 1
    # As if the rail had answered 404 long enough to say it never got it: the next poll resends,
    # and the rail refuses the repeated reference.
    sql(
        "UPDATE refunds SET status = 'submitting', not_found_count = 99,"
        " first_not_found_at = now() - interval '1 day' WHERE id = %s",
        [refund],
    )
    sandbox_rail.scenario(reference=refund, submit_status=422)
    run_poll()
    assert len(posts(sandbox_rail, refund)) == 2  # it did resend
    assert scalar("SELECT status FROM refunds WHERE id = %s", [refund]) == "submitting"
    assert amount_refunded(intent) == 2000  # not given back: the first send may have landed
    # The streak that justified the resend is forgotten: the next poll asks, it does not resend.
    assert scalar("SELECT not_found_count FROM refunds WHERE id = %s", [refund]) == 0


def test_a_refund_escalated_before_it_was_ever_sent_is_sent(acme, sandbox_rail):
    intent = acme.paid_intent(amount=5000)
    refund = acme.refund(intent, amount=1500).json()["id"]
    assert refund_repository.escalate(refund)  # e.g. a rail down past the horizon, nothing sent
    run_poll()
    assert len(posts(sandbox_rail, refund)) == 1
    assert sandbox_rail._get(f"/__admin/refunds?charge_reference={_charge_of(intent)}")["refunds"]


def test_the_backstop_gives_a_live_refund_its_poll_back_unless_its_letter_awaits_review(acme):
    intent = acme.paid_intent(amount=5000)
    lost = acme.refund(intent, amount=1000).json()["id"]
    lettered = acme.refund(intent, amount=1000).json()["id"]
    sql("DELETE FROM jobs WHERE kind = 'poll_refund'")
    DeadLetterFactory(
        kind="poll_refund",
        payload={"refund_id": lettered},
        dedupe_key=refund_repository.poll_dedupe_key(lettered),
        attempts=1,
        cause="permanent",
        error_category="permanent",
    )
    assert _restore_refund_polls() == 1
    assert sql("SELECT dedupe_key FROM jobs WHERE kind = 'poll_refund'") == [(refund_repository.poll_dedupe_key(lost),)]
    assert _restore_refund_polls() == 0  # a live job: nothing to do


def _charge_of(intent_id: str) -> str:
    return scalar("SELECT id FROM charges WHERE intent_id = %s", [intent_id])


def test_a_status_read_the_rail_refuses_is_a_non_answer_never_a_dead_letter(acme, sandbox_rail):
    intent = acme.paid_intent(amount=5000)
    refund = acme.refund(intent, amount=2000).json()["id"]
    run_poll()  # sent: the rail holds it, pending
    sandbox_rail.scenario(reference=refund, error_polls=1, error_status=422)
    run_poll()  # the status read, refused
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    assert scalar("SELECT status FROM refunds WHERE id = %s", [refund]) == "pending"
    assert scalar("SELECT count(*) FROM jobs WHERE kind = 'poll_refund' AND last_error LIKE '%%unavailable%%'") == 1
    run_poll()  # asked again: the rail's answer settles it
    assert scalar("SELECT status FROM refunds WHERE id = %s", [refund]) == "succeeded"
    assert amount_refunded(intent) == 2000
