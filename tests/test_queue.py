"""jobs.adapters.postgres: enqueue and enqueue_many against the real database (pull_forward:
tests/test_queue_pull_forward.py)."""

from __future__ import annotations

import json
import math
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.adapters import postgres as queue
from jobs.adapters.postgres import EnqueueError, JobRequest
from jobs.kinds import JobKind
from jobs.storage import repository
from tests.conftest import database_url
from tests.queue_support import claim, count, one, rows, scalar, seconds_until_run, task_payload

NOOP = task_payload()

pytestmark = pytest.mark.django_db


# --- enqueue -------------------------------------------------------------------------------


def test_enqueue__writes_one_unleased_row_with_the_arguments_given():
    job_id = queue.enqueue(
        JobKind.TASK,
        NOOP,
        queue="mail",
        priority=-3,
        tenant="acme",
        correlation_id="req-1",
        max_attempts=2,
    )
    assert isinstance(job_id, uuid.UUID)
    row = one(
        "SELECT kind, queue, payload, priority, tenant, correlation_id, attempts, max_attempts, deferrals,"
        "       locked_at, lease_token, dedupe_key, last_error FROM jobs WHERE job_id = %s",
        [job_id],
    )
    assert row[:9] == (
        "task",
        "mail",
        '{"args": [], "task": "tests.tasks.noop", "kwargs": {}}',
        -3,
        "acme",
        "req-1",
        0,
        2,
        0,
    )
    assert row[9:] == (None, None, None, "")


def test_enqueue__takes_max_attempts_from_the_kinds_retry_policy_at_call_time(settings):
    settings.VPAY_TASK_MAX_ATTEMPTS = 3
    job_id = queue.enqueue(JobKind.TASK, NOOP)
    assert scalar("SELECT max_attempts FROM jobs WHERE job_id = %s", [job_id]) == 3


def test_enqueue__accepts_the_kind_as_a_plain_string():
    assert queue.enqueue("task", NOOP) is not None


@pytest.mark.parametrize("delay", [None, 0, 90, 2.5, timedelta(minutes=10)])
def test_enqueue__run_at_is_the_database_now_plus_the_delay(delay):
    job_id = queue.enqueue(JobKind.TASK, NOOP, delay=delay)
    expected = delay.total_seconds() if isinstance(delay, timedelta) else (delay or 0)
    # Measured by PostgreSQL, not by this host's clock.
    assert seconds_until_run(job_id) == pytest.approx(expected, abs=0.5)


def test_enqueue__uses_the_job_id_given():
    job_id = uuid.uuid4()
    assert queue.enqueue(JobKind.TASK, NOOP, job_id=job_id) == job_id
    assert count("jobs", "job_id = %s", [job_id]) == 1


def test_enqueue__a_second_enqueue_with_a_live_dedupe_key_is_a_no_op_returning_none():
    first = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.record", "first"), dedupe_key="k1")
    second = queue.enqueue(JobKind.TASK, task_payload("tests.tasks.record", "second"), dedupe_key="k1", delay=60)
    assert first is not None
    assert second is None
    assert count("jobs") == 1
    # The live row is the first one, untouched.
    assert scalar("SELECT payload->'args'->>0 FROM jobs WHERE dedupe_key = 'k1'") == "first"
    assert seconds_until_run(first) == pytest.approx(0, abs=0.5)


def test_enqueue__a_dedupe_key_is_free_again_once_its_job_is_gone():
    queue.enqueue(JobKind.TASK, NOOP, dedupe_key="k2")
    (job,) = claim().jobs
    assert repository.finish_many([(job.id, job.lease_token)]) == {job.id}
    assert queue.enqueue(JobKind.TASK, NOOP, dedupe_key="k2") is not None


def test_enqueue__a_second_enqueue_with_a_live_job_id_is_a_no_op_returning_none():
    job_id = uuid.uuid4()
    queue.enqueue(JobKind.TASK, NOOP, job_id=job_id)
    assert queue.enqueue(JobKind.TASK, NOOP, job_id=job_id) is None
    assert count("jobs") == 1


def test_enqueue__writes_in_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        queue.enqueue(JobKind.TASK, NOOP)
        assert count("jobs") == 1
        raise RuntimeError("the business write failed")
    assert count("jobs") == 0


INVALID = {
    "unknown kind": {"kind": "bogus"},
    "payload not a mapping": {"payload": [("task", "x")]},
    "payload missing a field": {"payload": {"task": "tests.tasks.noop", "args": []}},
    "payload unknown field": {"payload": {**NOOP, "extra": 1}},
    "payload wrong type": {"payload": {**NOOP, "args": "a"}},
    "payload not json": {"payload": {**NOOP, "kwargs": {"when": object()}}},
    "payload with nan": {"payload": {**NOOP, "kwargs": {"x": math.nan}}},
    "priority too high": {"priority": 32768},
    "priority too low": {"priority": -32769},
    "priority bool": {"priority": True},
    "priority float": {"priority": 1.5},
    "priority str": {"priority": "1"},
    "delay negative": {"delay": -1},
    "delay negative timedelta": {"delay": timedelta(seconds=-1)},
    "delay str": {"delay": "10"},
    "delay bool": {"delay": True},
    "delay nan": {"delay": math.nan},
    "delay infinite": {"delay": math.inf},
    "queue empty": {"queue": ""},
    "queue too long": {"queue": "q" * 65},
    "queue none": {"queue": None},
    "queue int": {"queue": 5},
    "tenant too long": {"tenant": "t" * 129},
    "tenant int": {"tenant": 5},
    "correlation_id too long": {"correlation_id": "c" * 129},
    "dedupe_key empty": {"dedupe_key": ""},
    "dedupe_key too long": {"dedupe_key": "k" * 513},
    "payload with a NUL": {"payload": {**NOOP, "args": ["a\x00b"]}},
    "tenant with a NUL in a batch": {"tenant": "t\x00"},
    "dedupe_key int": {"dedupe_key": 5},
    "job_id str": {"job_id": str(uuid.uuid4())},
    "max_attempts zero": {"max_attempts": 0},
    "max_attempts float": {"max_attempts": 2.0},
}


@pytest.mark.parametrize("override", list(INVALID.values()), ids=list(INVALID))
def test_enqueue__refuses_an_invalid_argument_with_an_enqueue_error_and_writes_nothing(override):
    kwargs = {"kind": JobKind.TASK, "payload": NOOP, **override}
    with pytest.raises(EnqueueError):
        queue.enqueue(kwargs.pop("kind"), kwargs.pop("payload"), **kwargs)
    assert count("jobs") == 0


@pytest.mark.parametrize("override", list(INVALID.values()), ids=list(INVALID))
def test_enqueue_many__refuses_an_invalid_request_anywhere_in_the_batch_and_writes_nothing(override):
    fields = {"kind": JobKind.TASK, "payload": NOOP, **override}
    requests = [JobRequest(JobKind.TASK, NOOP) for _ in range(4)]
    requests.insert(2, JobRequest(fields.pop("kind"), fields.pop("payload"), **fields))
    with pytest.raises(EnqueueError):
        queue.enqueue_many(requests)
    assert count("jobs") == 0


def test_a_circular_payload_is_refused_on_both_paths():
    args: list = []
    args.append(args)
    for enqueue in (
        lambda: queue.enqueue(JobKind.TASK, {**NOOP, "args": args}),
        lambda: queue.enqueue_many([JobRequest(JobKind.TASK, NOOP), JobRequest(JobKind.TASK, {**NOOP, "args": args})]),
    ):
        with pytest.raises(EnqueueError, match="not JSON-serializable"):
            enqueue()
    assert count("jobs") == 0


def test_the_batch_encoder_writes_exactly_what_the_one_by_one_encoder_writes():
    from jobs.adapters.postgres import _batch_encoder, _encode

    circular: list = []
    circular.append(circular)
    encode = _batch_encoder()
    for payload in (
        NOOP,
        {"ünï": "cödé 🙂", "tab": "\t", "nested": [{"a": None}, 1.5, -0.0, 10**30, True]},
        {1: "int key", None: "none key", False: "bool key", 2.5: "float key"},
        {},
    ):
        assert encode(payload, "task") == _encode(payload, "task")
    for bad in ({"x": math.nan}, {"x": math.inf}, {"x": object()}, {(1, 2): "tuple key"}, {"c": circular}):
        with pytest.raises(EnqueueError):
            _encode(bad, "task")
        with pytest.raises(EnqueueError):
            _batch_encoder()(bad, "task")  # a refusal ends its batch: a fresh encoder each


def test_enqueue_many__stores_each_payload_exactly_as_given():
    values = [
        'tab\there, newline\nthere, back\\slash, quote" and ünïcödé 🙂',
        {"nested": [1, -2.5, 10**20, True, False, None, {"deep": []}]},
        1e-300,
        "\\N",  # COPY's NULL marker, as data
    ]
    requests = [JobRequest(JobKind.TASK, task_payload("tests.tasks.record", value)) for value in values]
    assert queue.enqueue_many(requests) == len(values)  # the COPY path: no key, id or delay
    stored = [json.loads(row[0]) for row in rows("SELECT payload::text FROM jobs ORDER BY id")]
    assert stored == [json.loads(json.dumps(task_payload("tests.tasks.record", value))) for value in values]


def test_an_enqueue_error_is_a_value_error():
    assert issubclass(EnqueueError, ValueError)


def test_enqueue__accepts_the_boundary_values_of_each_argument():
    job_id = queue.enqueue(
        JobKind.TASK,
        NOOP,
        priority=32767,
        queue="q" * 64,
        tenant="t" * 128,
        correlation_id="c" * 128,
        max_attempts=1,
    )
    assert queue.enqueue(JobKind.TASK, NOOP, priority=-32768) is not None
    assert count("jobs") == 2
    assert scalar("SELECT priority FROM jobs WHERE job_id = %s", [job_id]) == 32767


# --- enqueue_many --------------------------------------------------------------------------


def test_enqueue_many__inserts_due_keyless_jobs_with_one_copy_and_no_insert():
    requests = [
        JobRequest(JobKind.TASK, task_payload("tests.tasks.record", str(i)), tenant=f"t{i % 3}", priority=i)
        for i in range(25)
    ]
    with CaptureQueriesContext(connection) as captured:
        assert queue.enqueue_many(requests) == 25
    # The COPY bypasses Django's query log; what it does log is the NOTIFY, and no INSERT.
    assert not [q["sql"] for q in captured.captured_queries if "INSERT INTO jobs" in q["sql"]]
    assert [q["sql"] for q in captured.captured_queries if "pg_notify" in q["sql"]]
    assert count("jobs") == 25
    assert scalar("SELECT count(DISTINCT tenant) FROM jobs") == 3
    # run_at came from the column default, the database clock.
    assert scalar("SELECT count(*) FROM jobs WHERE run_at <= now()") == 25


def test_enqueue_many__inserts_keyed_or_delayed_jobs_in_one_statement():
    requests = [
        JobRequest(JobKind.TASK, task_payload("tests.tasks.record", str(i)), dedupe_key=f"k{i}", delay=i)
        for i in range(25)
    ]
    with CaptureQueriesContext(connection) as captured:
        assert queue.enqueue_many(requests) == 25
    inserts = [q["sql"] for q in captured.captured_queries if "INSERT INTO jobs" in q["sql"]]
    assert len(inserts) == 1
    assert count("jobs") == 25


def test_enqueue_many__computes_each_run_at_from_its_own_delay_on_the_database_clock():
    now_id, later_id = uuid.uuid4(), uuid.uuid4()
    queue.enqueue_many(
        [
            JobRequest(JobKind.TASK, NOOP, job_id=now_id),
            JobRequest(JobKind.TASK, NOOP, job_id=later_id, delay=timedelta(seconds=300)),
        ]
    )
    assert seconds_until_run(now_id) == pytest.approx(0, abs=0.5)
    assert seconds_until_run(later_id) == pytest.approx(300, abs=0.5)


def test_enqueue_many__counts_only_new_jobs_and_skips_live_dedupe_keys():
    queue.enqueue(JobKind.TASK, NOOP, dedupe_key="live")
    new = queue.enqueue_many(
        [
            JobRequest(JobKind.TASK, NOOP, dedupe_key="live"),
            JobRequest(JobKind.TASK, NOOP, dedupe_key="fresh"),
            JobRequest(JobKind.TASK, NOOP, dedupe_key="fresh"),  # a duplicate inside the batch
            JobRequest(JobKind.TASK, NOOP),
        ]
    )
    assert new == 2
    assert count("jobs") == 3


def test_enqueue_many__skips_a_live_job_id():
    job_id = queue.enqueue(JobKind.TASK, NOOP)
    assert queue.enqueue_many([JobRequest(JobKind.TASK, NOOP, job_id=job_id), JobRequest(JobKind.TASK, NOOP)]) == 1
    assert count("jobs") == 2


def test_enqueue_many__refuses_a_payload_that_is_not_json_and_writes_nothing():
    requests = [JobRequest(JobKind.TASK, NOOP), JobRequest(JobKind.TASK, {**NOOP, "kwargs": {"at": object()}})]
    with pytest.raises(EnqueueError):
        queue.enqueue_many(requests)
    assert count("jobs") == 0


def test_enqueue_many__is_all_or_nothing_on_validation():
    requests = [JobRequest(JobKind.TASK, NOOP) for _ in range(5)]
    requests.insert(3, JobRequest(JobKind.TASK, NOOP, priority=10**6))
    with CaptureQueriesContext(connection) as captured, pytest.raises(EnqueueError):
        queue.enqueue_many(requests)
    assert count("jobs") == 0
    # Validation runs before any statement.
    assert not [q for q in captured.captured_queries if "INSERT" in q["sql"]]


def test_enqueue_many__of_nothing_writes_nothing_and_returns_zero():
    with CaptureQueriesContext(connection) as captured:
        assert queue.enqueue_many([]) == 0
    assert captured.captured_queries == []


# --- NOTIFY at commit ----------------------------------------------------------------------


@pytest.fixture
def listener():
    """A separate connection LISTENing on the queue's channel, as a worker's listener does."""
    conn = psycopg.connect(database_url(), autocommit=True)
    conn.execute(f"LISTEN {repository.NOTIFY_CHANNEL}")
    yield conn
    conn.close()


def received(conn: psycopg.Connection, expected: int = 0) -> list[str]:
    """The payloads delivered to ``conn``: waits for ``expected`` of them (at most 2 s), then
    0.2 s more for any extra one."""
    payloads = [n.payload for n in conn.notifies(timeout=2.0, stop_after=expected)] if expected else []
    payloads += [n.payload for n in conn.notifies(timeout=0.2)]
    return payloads


@pytest.mark.django_db(transaction=True)
def test_enqueue__notifies_listeners_at_commit_and_not_before(listener):
    with transaction.atomic():
        queue.enqueue(JobKind.TASK, NOOP, queue="default")
        assert received(listener) == []
    assert received(listener, 1) == ["default"]


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_rolled_back_enqueue_notifies_nobody(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        queue.enqueue(JobKind.TASK, NOOP)
        raise RuntimeError("rolled back")
    assert received(listener) == []


@pytest.mark.django_db(transaction=True)
def test_enqueue__a_delayed_job_or_a_deduplicated_one_notifies_nobody(listener):
    queue.enqueue(JobKind.TASK, NOOP, dedupe_key="d")
    assert received(listener, 1) == ["default"]
    queue.enqueue(JobKind.TASK, NOOP, dedupe_key="d")  # a no-op
    queue.enqueue(JobKind.TASK, NOOP, delay=60)  # not due: nobody to wake
    assert received(listener) == []
    assert count("jobs") == 2


@pytest.mark.django_db(transaction=True)
def test_enqueue_many__notifies_each_queue_with_due_work_once_at_commit(listener):
    with transaction.atomic():
        queue.enqueue_many(
            [
                JobRequest(JobKind.TASK, NOOP, queue="a"),
                JobRequest(JobKind.TASK, NOOP, queue="a"),
                JobRequest(JobKind.TASK, NOOP, queue="b"),
                JobRequest(JobKind.TASK, NOOP, queue="later", delay=60),
            ]
        )
        assert received(listener) == []
    assert sorted(received(listener, 2)) == ["a", "b"]


@pytest.mark.django_db(transaction=True)
def test_pull_forward__notifies_the_jobs_queue_at_commit(listener):
    queue.enqueue(JobKind.SWEEP_EXPIRED, {}, dedupe_key="sweep", queue="house", delay=3600)
    assert received(listener) == []
    assert queue.pull_forward("sweep") is True
    assert received(listener, 1) == ["house"]


def test_enqueue_runs_as_a_prepared_statement_that_an_execute_wrapper_still_sees():
    queue.enqueue(JobKind.TASK, NOOP)
    # Prepared once on this connection (the session's own pg_prepared_statements).
    assert scalar("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%INSERT INTO jobs%'") >= 1
    seen: list[str] = []

    def spy(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    # A fenced group's lazy savepoint is such a wrapper: it must see the insert.
    with connection.execute_wrapper(spy):
        assert queue.enqueue(JobKind.TASK, NOOP) is not None
    assert any("INSERT INTO jobs" in sql for sql in seen)
    assert count("jobs") == 2


def test_bulk_job_ids_are_distinct_version_4_uuids():
    from jobs.adapters.postgres import _uuid4_texts

    texts = _uuid4_texts(2000)
    assert len(set(texts)) == 2000
    for text in texts:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_a_delay_counts_from_the_enqueueing_statement_not_from_the_start_of_its_transaction():
    # The test runs inside one transaction; let it age before enqueueing.
    scalar("SELECT pg_sleep(0.4)::text")
    delayed = queue.enqueue(JobKind.TASK, NOOP, delay=10)
    due = queue.enqueue(JobKind.TASK, NOOP)
    # The delayed job is 10 s after the statement, so more than 10.3 s after now() (the
    # transaction's start); a due job is due at now(), claimable within this transaction.
    assert scalar("SELECT extract(epoch FROM run_at - now())::float8 FROM jobs WHERE job_id = %s", [delayed]) > 10.3
    assert scalar("SELECT run_at = now() FROM jobs WHERE job_id = %s", [due]) is True
