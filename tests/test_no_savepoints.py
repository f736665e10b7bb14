"""The payment path's writes that run inside their caller's transaction open no savepoint of
their own: SAVEPOINT and RELEASE were two round trips of every intent's create and every
fan-out page (bench/CHARGES.md). Each statement sent on Django's connection is captured (the
prepared paths step aside while queries are captured, so every statement goes through the
cursor) against the real database."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from charges.services.intents import create_intent
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from merchants.services import create_merchant
from tests.queue_support import task_payload

pytestmark = pytest.mark.django_db(transaction=True)


def savepoints(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" in q["sql"].upper()]


def test_an_intents_create_inside_the_apis_transaction_opens_no_savepoint():
    merchant = create_merchant("No Savepoints")[0]
    with CaptureQueriesContext(connection) as captured, transaction.atomic():  # the API route's
        create_intent(merchant, {"amount": 500, "currency": "usd", "rail": "sandbox_push"})
    assert captured.captured_queries and savepoints(captured) == []


@pytest.mark.parametrize("named", [True, False], ids=["insert", "copy"])
def test_enqueue_many_inside_its_callers_transaction_opens_no_savepoint(named):
    requests = [
        queue.JobRequest(JobKind.TASK, task_payload(), dedupe_key=f"nosp:{i}" if named else None) for i in range(3)
    ]
    with CaptureQueriesContext(connection) as captured, transaction.atomic():  # the fan-out's page
        assert queue.enqueue_many(requests) == 3
    assert captured.captured_queries and savepoints(captured) == []
