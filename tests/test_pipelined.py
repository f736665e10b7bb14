"""vpay.pipelined: a prepared statement sent with its transaction commands in one pipeline,
against the real database; and the claim that uses it, row for row as the plain path."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import DataError, connection, transaction
from django.test.utils import override_settings

from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.storage import leases, sql
from tests.conftest import database_url
from tests.queue_support import task_payload
from vpay.pipelined import _statement, execute_pipelined, fetch_prepared

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("effects")]

ASYNC = (b"BEGIN", b"SET LOCAL synchronous_commit TO off")


def prepared_here(statement: str) -> int:
    name = _statement(statement)[0].decode()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", [name])
        return cursor.fetchone()[0]


def committed(label: str) -> bool:
    with psycopg.connect(database_url(), autocommit=True) as other:
        return other.execute("SELECT count(*) FROM test_effects WHERE label = %s", [label]).fetchone()[0] == 1


INSERT = "INSERT INTO test_effects (label, value) VALUES (%(label)s, %(value)s) RETURNING id, label, value"


def test_rows_come_back_typed_and_the_statement_is_prepared_once():
    statement = (
        "SELECT %(n)s::int + 1, %(t)s::text, %(u)s::uuid, %(ids)s::bigint[], %(n)s::int, %(none)s::text, %(doc)s::jsonb"
    )
    some = uuid.uuid4()
    params = {"n": 41, "t": 'a"b\\c', "u": some, "ids": [1, 2], "none": None, "doc": '{"k": [1]}'}
    for _ in range(2):
        rows = execute_pipelined(statement, params, before=ASYNC, after=(b"COMMIT",), in_transaction=False)
        # jsonb as text, as from a Django cursor (Django loads JSON itself, per field)
        assert rows == [(42, 'a"b\\c', some, [1, 2], 41, None, '{"k": [1]}')]
    assert prepared_here(statement) == 1
    assert execute_pipelined("SELECT 1 WHERE %(x)s::bool", {"x": False}, in_transaction=False) == []


def test_its_own_transaction_commits_with_the_pipeline():
    rows = execute_pipelined(
        INSERT, {"label": "own", "value": "1"}, before=ASYNC, after=(b"COMMIT",), in_transaction=False
    )
    assert [r[1:] for r in rows] == [("own", "1")]
    assert committed("own")
    assert connection.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_inside_atomic_it_begins_the_transaction_and_never_commits_it():
    with transaction.atomic():
        # Nothing has run yet: psycopg has not sent BEGIN, so the pipeline does.
        execute_pipelined(INSERT, {"label": "inner", "value": "2"}, in_transaction=True)
        assert not committed("inner")
        execute_pipelined(INSERT, {"label": "inner2", "value": "3"}, in_transaction=True)  # BEGIN already sent
        assert not committed("inner")
    assert committed("inner") and committed("inner2")
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_pipelined(INSERT, {"label": "rolled", "value": "4"}, in_transaction=True)
        raise RuntimeError
    assert not committed("rolled")


def test_an_error_is_the_database_error_and_leaves_no_transaction_behind():
    execute_pipelined(INSERT, {"label": "dup", "value": "1"}, before=ASYNC, after=(b"COMMIT",), in_transaction=False)
    statement = "SELECT 1 / %(zero)s::int"
    with pytest.raises(Exception) as raised:
        sql.bookkeeping(statement, {"zero": 0}, prepared=True)
    assert "division by zero" in str(raised.value)
    assert connection.connection is None  # bookkeeping closed it all the same; the next call reconnects
    assert sql.bookkeeping("SELECT %(one)s::int", {"one": 1}, prepared=True) == [(1,)]


def test_a_statement_deallocated_under_it_is_prepared_again():
    statement = "SELECT %(v)s::int * 2"
    assert execute_pipelined(statement, {"v": 2}, before=ASYNC, after=(b"COMMIT",), in_transaction=False) == [(4,)]
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert execute_pipelined(statement, {"v": 3}, before=ASYNC, after=(b"COMMIT",), in_transaction=False) == [(6,)]


def test_not_used_where_it_must_not_be():
    with override_settings(VPAY_DB_PREPARED_STATEMENTS=False):
        assert execute_pipelined("SELECT 1", {}, in_transaction=False) is None
    with transaction.atomic():
        # Django's atomic: the autocommit-only form refuses (it would commit someone else's work).
        assert execute_pipelined("SELECT 1", {}, in_transaction=False) is None


def test_the_claim_answers_the_same_rows_prepared_and_plain():
    for i in range(6):
        queue.enqueue(JobKind.TASK, task_payload(), tenant=f"t{i % 3}")
    common = {
        "queues": ["default"],
        "kinds": [JobKind.TASK.value],
        "batch": 2,
        "lease_seconds": 30.0,
        "kind_leases": {},
        "default_lease": 30.0,
        "after": "",
        "max_tenants": 64,
    }
    fast = leases.claim(worker="w-fast", **common)
    assert prepared_here(leases.CLAIM) == 1
    with override_settings(VPAY_DB_PREPARED_STATEMENTS=False):
        plain = leases.claim(worker="w-plain", **common)
    assert prepared_here(leases.CLAIM) == 1  # the plain one was not prepared
    assert len(fast.jobs) == len(plain.jobs) == 2
    for a, b in zip(fast.jobs, plain.jobs, strict=True):
        assert type(a.job_id) is type(b.job_id) is uuid.UUID
        assert {f: type(getattr(a, f)) for f in a.__dataclass_fields__} == {
            f: type(getattr(b, f)) for f in b.__dataclass_fields__
        }
    assert fast.next_after and plain.next_after


def test_a_fenced_job_that_writes_finishes_through_the_prepared_fence_in_its_own_transaction():
    from jobs.runner.worker import Worker
    from jobs.storage import fence_sql

    job_id = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.record", "wrote"), tenant="t")
    assert Worker(worker_id="w", concurrency=1).run_once() == 1
    assert prepared_here(fence_sql._FENCE_AND_FINISH) == 1
    assert committed("wrote")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM processed_jobs WHERE job_id = %s", [job_id])
        assert cursor.fetchone()[0] == 1
        cursor.execute("SELECT count(*) FROM jobs WHERE job_id = %s", [job_id])
        assert cursor.fetchone()[0] == 0


def fields_of(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_settlements_read_and_the_ceilings_record_answer_the_same_prepared_and_plain(rails):
    from charges import repository, request_log
    from charges.models import CheckoutSession, RequestOperation
    from tests.factories.payments import IntentFactory

    intent = IntentFactory(paid=True, metadata={"order": "o-1", "n": "2"})
    CheckoutSession.objects.create(merchant=intent.merchant, intent=intent, client_secret="cs_x_secret_y")
    read = {}
    for prepared in (True, False):
        with override_settings(VPAY_DB_PREPARED_STATEMENTS=prepared), transaction.atomic():
            got, session = repository.for_event(intent.id)
            read[prepared] = (fields_of(got), fields_of(got.charge), fields_of(session))
    assert prepared_here(repository._FOR_EVENT) == 1  # the first read was prepared
    assert read[True] == read[False]  # every field as the plain path loads it: JSON, times, ids
    assert read[True][0]["metadata"] == {"order": "o-1", "n": "2"}

    recorded = {}
    for prepared in (True, False):
        with override_settings(VPAY_DB_PREPARED_STATEMENTS=prepared):
            recorded[prepared] = request_log.record_sent_within_ceiling(
                got.charge.id,
                RequestOperation.SUBMIT,
                rail="sandbox_push",
                method="POST",
                path="/charges",
                idempotency_key=None,
                ceiling=8,
                bound_seconds=25.0,
            )
    assert prepared_here(request_log._WITHIN_CEILING) == 1
    (first, left_1, resend_1), (second, left_2, resend_2) = recorded[True], recorded[False]
    assert type(first) is type(second) is int and second > first
    # The confirm's submit went out first: both are resends. Nothing was in flight before the
    # first; the first was, before the second.
    assert (resend_1, resend_2) == (True, True)
    assert left_1 is None and type(left_2) is float and 0 < left_2 <= 25
    assert connection.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_the_guarded_status_write_is_one_prepared_statement_and_writes_what_the_queryset_would(rails):
    from django.db.models.functions import Now

    from charges import guarded
    from charges.models import PaymentIntent
    from charges.states import IntentStatus
    from tests.factories.payments import IntentFactory

    a, b = IntentFactory(), IntentFactory()
    for intent, prepared in ((a, True), (b, False)):
        with override_settings(VPAY_DB_PREPARED_STATEMENTS=prepared):
            # A source it is not in: nothing moves.
            assert not guarded.cas(PaymentIntent, intent.id, [IntentStatus.PROCESSING], status=IntentStatus.CANCELED)
            assert guarded.cas(
                PaymentIntent,
                intent.id,
                [IntentStatus.REQUIRES_CONFIRMATION],
                status=IntentStatus.CANCELED,
                cancellation_reason="duplicate",
                canceled_at=Now(),
            )
    label = PaymentIntent._meta.label
    for columns in ((("status", False),), (("status", False), ("cancellation_reason", False), ("canceled_at", True))):
        assert prepared_here(guarded._CAS_SQL[(label, columns)]) == 1  # once, by the prepared turn
    rows = {
        p.id: (p.status, p.cancellation_reason, p.canceled_at is not None, p.updated_at >= p.created_at)
        for p in PaymentIntent.objects.filter(id__in=[a.id, b.id])
    }
    assert rows[a.id] == rows[b.id] == ("canceled", "duplicate", True, True)


def test_a_statement_whose_first_run_fails_stays_usable_on_its_connection():
    # The server keeps what it prepared though the run after it failed and its transaction
    # rolled back: forgotten, the next call would prepare the name again and fail (42P05).
    statement = "SELECT 10 / %(z)s::int"
    for _ in range(2):
        with pytest.raises(DataError), transaction.atomic():
            fetch_prepared(statement, {"z": 0})
    with transaction.atomic():
        with pytest.raises(DataError):
            fetch_prepared(statement, {"z": 0})
        # Caught, as a queryset's failure would be: the transaction is marked for rollback.
        assert connection.needs_rollback
    with transaction.atomic():
        assert fetch_prepared(statement, {"z": 5}) == [(2,)]
    assert fetch_prepared(statement, {"z": 2}) == [(5,)]  # alone, in autocommit
    assert prepared_here(statement) == 1


def test_a_payment_through_the_api_runs_its_hot_statements_prepared(rails):
    """The /v1 authentication, the confirm's lock and session check, the rail answer's
    record, the poll's read, the settlement's write and read and the fan-out's wake: each
    prepared once on the connection that ran them (a revert to Django's cursor fails here)."""
    from charges import repository, request_log, settlement_writes
    from charges.services import transitions
    from jobs.storage import pull_forward_sql
    from merchants import credentials
    from tests.charges_support import Merchant
    from vpay import prepared

    acme = Merchant("Acme")
    intent = acme.confirm(acme.intent(amount=5000)["id"])
    assert transitions.succeed(repository.read_for_poll(intent["charge"]["id"]))
    for statement in (
        credentials._BY_SECRET_KEY,
        repository._LOCK_FOR_CONFIRM,
        repository._SESSION_DEAD,
        request_log._RECORD_ANSWER,
        repository._READ_FOR_POLL,
        settlement_writes._SETTLE,
    ):
        assert prepared_here(statement) == 1, statement
    wake = prepared._statement(pull_forward_sql._PULL_FORWARD)[0].decode()
    assert scalar_here("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", [wake]) == 1


def scalar_here(query: str, params) -> int:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()[0]


def test_a_generic_statement_is_planned_once_and_leaves_the_mode_as_it_was():
    """``fetch_prepared(generic=True)``: no custom plan at any call (an array's custom plan
    looks cheaper to plan_cache_mode auto, so it was planned again at almost every call), in
    the caller's transaction the mode set back after it, alone its own transaction."""
    statement = "SELECT count(*) FROM test_effects WHERE id = ANY(%(ids)s::bigint[])"
    for n in range(8):
        assert fetch_prepared(statement, {"ids": list(range(n))}, generic=True) == [(0,)]
    with transaction.atomic():
        assert fetch_prepared(statement, {"ids": [1]}, generic=True) == [(0,)]
        with connection.cursor() as cursor:
            cursor.execute("SHOW plan_cache_mode")
            assert cursor.fetchone() == ("auto",)
    assert connection.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s",
            [_statement(statement)[0].decode()],
        )
        generic, custom = cursor.fetchone()
    assert (generic, custom) == (9, 0)
