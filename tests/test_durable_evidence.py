"""Evidence commits durably: a dead letter, and the error a retry records, are committed
with ``synchronous_commit`` on, so a database crash cannot take them back (the reaper
would then rewrite a lost dead letter as ``lease_exhausted`` and the real error is gone).

PostgreSQL itself reports the commit mode: a trigger on the evidence rows records
``current_setting('synchronous_commit')`` in the very transaction that writes them.
"""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.runner.worker import Worker
from tests import tasks
from tests.queue_support import expire_lease

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def commit_modes():
    """Rows of (what, synchronous_commit) for each evidence write, by trigger."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_commit_modes (id bigserial PRIMARY KEY, what text NOT NULL, mode text NOT NULL);"
            "CREATE FUNCTION test_record_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN INSERT INTO test_commit_modes (what, mode)"
            "       VALUES (TG_ARGV[0], current_setting('synchronous_commit')); RETURN NULL; END $$;"
            "CREATE TRIGGER test_dead_letter_mode AFTER INSERT ON dead_letters"
            " FOR EACH ROW EXECUTE FUNCTION test_record_commit_mode('dead_letter');"
            "CREATE TRIGGER test_retry_error_mode AFTER UPDATE ON jobs FOR EACH ROW"
            " WHEN (NEW.last_error IS DISTINCT FROM OLD.last_error AND NEW.locked_at IS NULL)"
            " EXECUTE FUNCTION test_record_commit_mode('retry_error');"
        )

    def modes() -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT what, mode FROM test_commit_modes ORDER BY id")
            return cursor.fetchall()

    try:
        yield modes
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER test_dead_letter_mode ON dead_letters; DROP TRIGGER test_retry_error_mode ON jobs;"
                "DROP FUNCTION test_record_commit_mode(); DROP TABLE test_commit_modes;"
            )


def test_a_dead_letter_is_committed_durably(commit_modes):
    tasks.fail_permanently.enqueue("refused")
    assert Worker(concurrency=1).run_once() == 1
    assert commit_modes() == [("dead_letter", "on")]


def test_the_error_a_retry_records_is_committed_durably(commit_modes):
    tasks.fail_transiently.enqueue("flaky")
    assert Worker(concurrency=1).run_once() == 1
    assert commit_modes() == [("retry_error", "on")]


def test_a_dead_letter_the_reaper_writes_is_committed_durably(commit_modes):
    job = tasks.fail_transiently.enqueue("dies")
    with connection.cursor() as cursor:
        # A worker died holding the job on its last attempt.
        cursor.execute(
            "UPDATE jobs SET attempts = max_attempts, locked_by = 'gone', lease_token = gen_random_uuid(),"
            " locked_at = now(), lease_expires_at = now() WHERE job_id = %s",
            [job.id],
        )
    expire_lease(job.id)
    assert Worker(concurrency=1).reap() == (0, 1)
    assert commit_modes() == [("dead_letter", "on")]


@pytest.mark.django_db(transaction=True)
def test_lease_bookkeeping_runs_without_jit_whatever_the_session_says():
    """A claim planned against a million delayed jobs is costed high enough to be JIT-compiled,
    and the compile cost 1.2 s against 7 ms of execution (bench/SOAK.md). Direct connections
    start with jit=off; behind a pooler only the claim's own transaction can say so."""
    from jobs.storage import sql as job_sql

    with connection.cursor() as cursor:
        cursor.execute("SET jit = on")  # as a pooled server session may have it
    try:
        assert job_sql.bookkeeping("SELECT current_setting('jit')", []) == [("off",)]
    finally:
        connection.close()
