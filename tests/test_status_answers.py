"""A status read's answer recorded with its settlement, its slot of the rail's ceiling handed
to the next status read in that transaction (charges/services/status_answers.py,
charges/request_log.py ``hand_over_slot``): the statement, and what each failure leaves."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from charges import request_log
from charges.models import RequestOperation
from charges.rails import get_rail
from charges.rails.adapter import RailAnswer
from charges.services import status_answers
from charges.states import RailStatus
from tests.charges_support import FAST_POLICY, apply_policy, scalar, sql, use_rails
from tests.test_poll_batch import submitted

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = RailAnswer(status=RailStatus.PENDING, http_status=200, body_excerpt='{"status":"pending"}')


@pytest.fixture
def charges(settings, tmp_path, sandbox_rail):
    apply_policy(settings, FAST_POLICY)
    use_rails(settings, tmp_path, sandbox_rail.rails())
    from merchants.services import create_merchant

    return submitted(create_merchant("Answers Ltd")[0], 2)


def sent(charge_id: str) -> int:
    return request_log.record_sent(
        charge_id, RequestOperation.STATUS, rail="sandbox_push", method="GET", path="/x", idempotency_key=None
    )


def rows() -> list[tuple]:
    return sql("SELECT charge_id, status_code, error, answered_at IS NOT NULL FROM provider_requests ORDER BY id")


def test_a_slot_is_handed_over_only_inside_a_transaction_and_only_while_the_request_is_young(charges):
    first, second = charges
    answered = sent(first)
    answer = {
        "status_code": 200,
        "rail_status": RailStatus.PENDING,
        "excerpt": "",
        "charge_id": second,
        "rail": "sandbox_push",
        "path": "/charges/x",
        "within_seconds": 20.0,
    }
    with pytest.raises(RuntimeError):
        request_log.hand_over_slot(answered, **answer)
    with transaction.atomic():
        handed = request_log.hand_over_slot(answered, **answer)
    assert handed is not None
    assert sql(
        "SELECT charge_id, operation, method, answered_at IS NULL FROM provider_requests WHERE id = %s", [handed]
    ) == [(second, "status", "GET", True)]
    # Sent 21 s ago against the 20 s given: still counted in flight (the bound is 25 s), but
    # too close to it for its successor's row to be sure to show before it stops counting.
    sql("UPDATE provider_requests SET sent_at = now() - interval '21 seconds' WHERE id = %s", [handed])
    with transaction.atomic():
        assert request_log.hand_over_slot(handed, **{**answer, "charge_id": first}) is None
    assert scalar("SELECT count(*) FROM provider_requests WHERE answered_at IS NULL") == 0
    assert scalar("SELECT count(*) FROM provider_requests") == 2


def test_the_transaction_must_be_its_own_since_the_row_it_hands_over_is_sent_next(charges):
    first, second = charges
    answered = sent(first)
    with pytest.raises(RuntimeError), transaction.atomic():
        status_answers.settle_with_answer(
            answered, ANSWER, get_rail("sandbox_push"), lambda: None, next_charge_id=second
        )
    assert rows() == [(first, None, "", False)]


def test_a_settlement_that_ends_past_the_batchs_deadline_hands_nothing_over(charges):
    first, second = charges
    answered = sent(first)
    deadline = time.monotonic() + 0.05

    def slow_settlement() -> str:
        time.sleep(0.1)  # waited on a lock, say
        return "settled"

    result = status_answers.settle_with_answer(
        answered, ANSWER, get_rail("sandbox_push"), slow_settlement, next_charge_id=second, hand_over_by=deadline
    )
    assert result == ("settled", None)
    assert rows() == [(first, 200, "", True)]


def test_a_row_handed_over_whose_transaction_fails_after_the_commit_is_closed_as_not_sent(charges):
    """An on-commit callback that raises comes out of the block after the COMMIT: the row
    handed over is durable, and its request will not be sent. It is answered as not sent, so
    it holds no slot and claims no request; the answer is recorded."""
    first, second = charges
    answered = sent(first)

    def settle_then_a_callback_fails() -> None:
        def fail() -> None:
            raise RuntimeError("an on-commit callback failed")

        transaction.on_commit(fail)

    with pytest.raises(RuntimeError, match="on-commit"):
        status_answers.settle_with_answer(
            answered, ANSWER, get_rail("sandbox_push"), settle_then_a_callback_fails, next_charge_id=second
        )
    [(_, code, _, was_answered), (charge, handed_code, error, handed_answered)] = rows()
    assert (code, was_answered) == (200, True)
    assert (charge, handed_code, handed_answered) == (second, None, True)
    assert error.startswith("not sent: the transaction that wrote it failed") and "on-commit" in error


def test_without_a_next_charge_the_answer_is_recorded_and_nothing_written(charges):
    first, _ = charges
    answered = sent(first)
    assert status_answers.settle_with_answer(answered, ANSWER, get_rail("sandbox_push"), lambda: 1) == (1, None)
    assert rows() == [(first, 200, "", True)]
