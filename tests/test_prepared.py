"""vpay.prepared: hot statements prepared with libpq on Django's connection, against the real database."""

from __future__ import annotations

import enum
import threading
import time
import uuid
from decimal import Decimal

import psycopg
import pytest
from django.db import DataError, IntegrityError, OperationalError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings

from tests.conftest import database_url
from tests.queue_support import scalar
from vpay.prepared import _statement, execute_prepared, text_param

INSERT_EFFECT = "INSERT INTO test_effects (label, value) VALUES (%s, %s) RETURNING id, label"


def prepared_here(sql: str) -> int:
    """How many times ``sql`` is prepared on this connection, by the server's account."""
    name = _statement(sql)[0].decode()
    return scalar("SELECT count(*) FROM pg_prepared_statements WHERE name = %s", [name])


def other_connection_sees(label: str) -> bool:
    with psycopg.connect(database_url(), autocommit=True) as other:
        return other.execute("SELECT count(*) FROM test_effects WHERE label = %s", [label]).fetchone()[0] == 1


@pytest.mark.django_db
def test_sends_every_parameter_type_as_text_and_answers_text():
    # The first statement of the test's transaction: sent with the BEGIN psycopg had not sent.
    assert execute_prepared("SELECT %s::int", [0]) == ("0",)
    some_id = uuid.uuid4()
    sql = "SELECT %s::int + 1, %s::text, %s::uuid, %s::bool, %s::float8, %s::text, %s::text"
    row = execute_prepared(sql, [41, "ünï", some_id, True, 0.1, None, "x" * 5000])
    assert row == ("42", "ünï", str(some_id), "t", "0.1", None, "x" * 5000)
    assert execute_prepared(sql, [-7, "", some_id, False, 1e-300, None, ""])[:5] == (
        "-6",
        "",
        str(some_id),
        "f",
        "1e-300",
    )
    assert prepared_here(sql) == 1  # prepared once, run twice


@pytest.mark.django_db
def test_no_row_is_none():
    assert execute_prepared("SELECT 1 WHERE %s::bool", [False]) is None


def test_refuses_a_parameter_it_cannot_send_exactly():
    class Colour(enum.IntEnum):
        RED = 1

    class Label(str):
        pass

    class Id(uuid.UUID):
        pass

    assert text_param(Label("x")) == b"x"  # a str subclass is its text
    assert text_param(Id(int=5)) == b"%032x" % 5
    # a list is an array literal, each element sent as itself (vpay.pipelined's array parameters)
    assert text_param([1, None, 'a"b\\']) == b'{"1",NULL,"a\\"b\\\\"}'
    for value in (Colour.RED, Decimal("1.5"), b"bytes", {1}, [Decimal("1")], [[1]]):
        with pytest.raises(TypeError, match="cannot send"):
            text_param(value)
    with pytest.raises(ValueError, match="placeholders"):
        _statement("SELECT %(name)s")


@pytest.mark.django_db(transaction=True)
def test_in_autocommit_the_row_is_committed_on_return(effects):
    execute_prepared(INSERT_EFFECT, ["auto", ""])
    assert other_connection_sees("auto")


@pytest.mark.django_db(transaction=True)
def test_runs_in_the_callers_transaction_and_rolls_back_with_it(effects):
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_prepared("SELECT %s::int", [1])  # the transaction is open on the server now
        execute_prepared(INSERT_EFFECT, ["rolled-back", ""])
        assert not other_connection_sees("rolled-back")
        raise RuntimeError
    # As the first statement of a block (psycopg has not sent BEGIN yet): still inside it,
    # and prepared, not sent through Django's cursor (planned at every call there).
    first = INSERT_EFFECT.replace("RETURNING id, label", "RETURNING id")  # not prepared yet
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_prepared(first, ["first-statement", ""])
        assert prepared_here(first) == 1
        raise RuntimeError
    # A failing first statement: the block's rollback ends the BEGIN sent for it.
    with pytest.raises(IntegrityError), transaction.atomic():
        execute_prepared("INSERT INTO test_effects (id, label, value) VALUES (%s, 'x', '')", [None])
    assert connection.connection.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Caught inside the block, as a queryset's failure would be: marked for rollback, so the
    # block cannot end in a COMMIT the server turns into a rollback (on_commit callbacks run).
    with transaction.atomic():
        execute_prepared(INSERT_EFFECT, ["lost-with-the-failure", ""])
        with pytest.raises(IntegrityError):
            execute_prepared("INSERT INTO test_effects (id, label, value) VALUES (%s, 'x', '')", [None])
        assert connection.needs_rollback
    assert effects() == []
    with transaction.atomic():
        execute_prepared(INSERT_EFFECT, ["kept", ""])
    assert effects() == [("kept", "")]


@pytest.mark.django_db(transaction=True)
def test_a_rollback_does_not_drop_the_prepared_statements(effects):
    # psycopg answers a rollback with DEALLOCATE ALL once it has prepared anything itself;
    # it must prepare nothing, or the next enqueue inside a transaction would fail.
    execute_prepared(INSERT_EFFECT, ["one", ""])
    # A server-binding psycopg cursor on the same connection, past psycopg's default
    # threshold of 5 (Django's own cursors bind client-side and never prepare).
    for _ in range(10):
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute("SELECT count(*) FROM test_effects WHERE label = %s", ["one"])
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_prepared(INSERT_EFFECT, ["two", ""])
        raise RuntimeError
    assert prepared_here(INSERT_EFFECT) == 1
    with transaction.atomic():
        execute_prepared("SELECT %s::int", [1])
        execute_prepared(INSERT_EFFECT, ["three", ""])
    assert [label for label, _ in effects()] == ["one", "three"]


@pytest.mark.django_db(transaction=True)
def test_a_statement_deallocated_under_it_is_prepared_again(effects):
    execute_prepared(INSERT_EFFECT, ["a", ""])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    # Autocommit: the failed call was its own transaction, so it is retried once, unseen.
    execute_prepared(INSERT_EFFECT, ["b", ""])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    # Inside a transaction the failure has aborted it: raised, and the block rolls back.
    with pytest.raises(ProgrammingError, match="does not exist"), transaction.atomic():
        execute_prepared("SELECT %s::int", [1])
        execute_prepared(INSERT_EFFECT, ["c", ""])
    execute_prepared(INSERT_EFFECT, ["d", ""])  # and prepared again for the next call
    assert [label for label, _ in effects()] == ["a", "b", "d"]


@pytest.mark.django_db(transaction=True)
def test_database_errors_arrive_as_djangos(effects):
    with pytest.raises(DataError):
        execute_prepared("SELECT 1 / %s::int", [0])
    with connection.cursor() as cursor:
        cursor.execute("CREATE UNIQUE INDEX test_effects_label_unique ON test_effects (label)")
    try:
        execute_prepared(INSERT_EFFECT, ["dup", ""])
        with pytest.raises(IntegrityError):
            execute_prepared(INSERT_EFFECT, ["dup", ""])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX test_effects_label_unique")


@pytest.mark.django_db(transaction=True)
def test_a_lost_connection_is_an_operational_error_and_the_next_connection_prepares_again():
    assert execute_prepared("SELECT %s::int", [1]) == ("1",)
    pid = scalar("SELECT pg_backend_pid()")
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):
        execute_prepared("SELECT %s::int", [2])
    connection.close()
    assert execute_prepared("SELECT %s::int", [3]) == ("3",)


@pytest.mark.django_db(transaction=True)
def test_at_a_new_request_a_dead_connection_is_replaced_as_djangos_cursor_would():
    assert connection.health_check_enabled  # CONN_HEALTH_CHECKS
    assert execute_prepared("SELECT %s::int", [1]) == ("1",)
    pid = scalar("SELECT pg_backend_pid()")
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    connection.health_check_done = False  # what Django resets when a request starts
    assert execute_prepared("SELECT %s::int", [2]) == ("2",)
    assert scalar("SELECT pg_backend_pid()") != pid


@pytest.mark.django_db(transaction=True)
def test_other_threads_run_while_it_waits_on_the_server():
    execute_prepared("SELECT pg_sleep(%s::float8)", [0.0])
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        time.sleep(0.05)
        before = ticks
        execute_prepared("SELECT pg_sleep(%s::float8)", [0.3])
        during = ticks - before
    finally:
        stop.set()
        thread.join()
    # Holding the GIL through the 0.3 s wait would leave the counter still; released, it counts
    # to millions here, so the bound leaves room for a loaded machine.
    assert during > 10_000


@pytest.mark.django_db
def test_logged_queries_and_execute_wrappers_see_the_statement():
    execute_prepared("SELECT %s::int", [0])  # the transaction is open: the libpq path is possible
    with CaptureQueriesContext(connection) as captured:
        assert execute_prepared("SELECT %s::int + 1", [1]) == (2,)  # Django's cursor: typed values
    assert any("SELECT 1::int + 1" in q["sql"] for q in captured.captured_queries)
    seen = []

    def spy(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        execute_prepared("SELECT %s::int + 2", [1])
    assert seen == ["SELECT %s::int + 2"]


@pytest.mark.django_db
@override_settings(VPAY_DB_PREPARED_STATEMENTS=False)
def test_switched_off_nothing_is_prepared():
    execute_prepared("SELECT %s::int", [0])  # the transaction is open: the libpq path is possible
    assert execute_prepared("SELECT %s::int + 3", [1]) == (4,)
    assert prepared_here("SELECT %s::int + 3") == 0


@pytest.mark.django_db(transaction=True)
def test_a_nul_character_is_refused_not_cut_short():
    # libpq would end the text parameter at the NUL and store "a".
    with pytest.raises(DataError, match="NUL"):
        execute_prepared("SELECT %s::text", ["a\x00b"])
    assert execute_prepared("SELECT %s::text", ["ab"]) == ("ab",)


@pytest.mark.django_db(transaction=True)
def test_a_connection_handed_to_another_wrapper_keeps_its_statements():
    # What Django's pool does: the same libpq connection serves another thread's wrapper.
    sql = "SELECT %s::int * 2"
    assert execute_prepared(sql, [1]) == ("2",)
    shared = connection.connection
    answers = []

    def other_thread() -> None:
        from django.db import connections

        wrapper = connections["default"]
        wrapper.connection = shared
        try:
            answers.append(execute_prepared(sql, [21]))  # PREPARE again would fail: 42P05
        except Exception as exc:  # reported to the main thread
            answers.append(exc)
        finally:
            wrapper.connection = None  # the main thread's, not this wrapper's to close

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert answers == [("42",)]
