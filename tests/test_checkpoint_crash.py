"""Checkpoints against real worker processes: a ``runworker`` SIGKILLed in the middle of the
customers sweep, and the replacement that resumes from the stored cursor; and a sweep
whose workers keep dying at the same row, dead-lettered as ``no_progress``.

The sweep is stopped mid-iteration by the database, not by test code in the worker: this
test holds one customer's row lock, so the sweep's erase of that customer waits on it,
pages after the cursor's last move.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from customers.models import Customer
from merchants.services import create_merchant
from tests.conftest import database_url, wait_for
from tests.queue_support import execute, rows, scalar
from tests.test_worker_process import wait_started

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KIND = "sweep_idle_customers"
FAST = ("--concurrency", "1", "--heartbeat", "0.5")  # leases of 3 s: a dead worker is reaped in seconds


def idle_customers(n: int) -> list[str]:
    """``n`` customers idle 400 days, in the sweep's keyset order (last_used_at, id)."""
    merchant = create_merchant("Checkpoints")[0]
    made = Customer.objects.bulk_create(Customer(merchant=merchant, email="x@example.com", name="X") for _ in range(n))
    ids = [c.id for c in made]
    execute(
        "UPDATE customers c SET last_used_at = now() - interval '400 days' - make_interval(secs => o.n)"
        " FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM customers WHERE id = ANY(%s)) o"
        " WHERE c.id = o.id",
        [ids],
    )
    return [r[0] for r in rows("SELECT id FROM customers WHERE id = ANY(%s) ORDER BY last_used_at, id", [ids])]


def hold_row_lock(customer_id: str) -> psycopg.Connection:
    """Another session's lock on one customer: the sweep's erase of it waits."""
    conn = psycopg.connect(database_url())
    conn.execute("SELECT 1 FROM customers WHERE id = %s FOR UPDATE", [customer_id])
    return conn


def sweep_stuck_after(last_key_id: str, worker: str, waiters: int = 1) -> bool:
    """The sweep is held by ``worker``, its checkpoint is at ``last_key_id`` and its erase is
    waiting on the row lock (``waiters`` counts the killed workers' sessions still queued)."""
    checkpoint, locked_by = (
        rows(f"SELECT checkpoint ->> 1, locked_by FROM jobs WHERE kind = '{KIND}'") or [(None, None)]
    )[0]
    waiting = scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return checkpoint == last_key_id and locked_by == worker and waiting >= waiters


def test_a_sweep_killed_mid_pass_resumes_from_its_checkpoint_not_from_the_start(start_worker):
    customers = idle_customers(250)  # pages of 100
    blocker = hold_row_lock(customers[150])  # the third page's 51st erase waits
    try:
        doomed = start_worker(*FAST, "--worker-id", "doomed")
        wait_for(lambda: sweep_stuck_after(customers[199 - 100], "doomed"), 60, message="the sweep to block")
        assert scalar("SELECT count(*) FROM customers WHERE id = ANY(%s)", [customers[:150]]) == 0
        doomed.kill()
        # Behind the cursor: a customer the resumed pass must not reach, a fresh one would.
        [behind] = idle_customers(1)
        execute("UPDATE customers SET last_used_at = now() - interval '500 days' WHERE id = %s", [behind])
    finally:
        blocker.rollback()
        blocker.close()
    replacement = start_worker(*FAST, "--worker-id", "replacement")
    wait_started(replacement)

    def pass_ended():
        left = rows(f"SELECT extract(epoch FROM run_at - now()), locked_at FROM jobs WHERE kind = '{KIND}'")
        return left and left[0][0] > 3000 and left[0][1] is None

    wait_for(pass_ended, 60, message="the resumed pass to end")
    assert scalar("SELECT count(*) FROM customers WHERE id = ANY(%s)", [customers]) == 0
    assert scalar("SELECT count(*) FROM customers WHERE id = %s", [behind]) == 1  # resumed, not restarted
    [(checkpoint, recoveries)] = rows(f"SELECT checkpoint, recoveries FROM jobs WHERE kind = '{KIND}'")
    assert checkpoint is None and recoveries == 0  # the pass reached the end: the next one starts over


def test_a_sweep_whose_workers_keep_dying_at_the_same_row_becomes_a_no_progress_dead_letter(start_worker):
    customers = idle_customers(150)
    blocker = hold_row_lock(customers[120])  # in the second page, after the first checkpoint
    env = {"VPAY_JOB_RECOVERY_CAP": "1"}
    try:
        first = start_worker(*FAST, "--worker-id", "first", env=env)
        wait_for(lambda: sweep_stuck_after(customers[99], "first"), 60, message="the first run to block")
        job_id = scalar(f"SELECT job_id FROM jobs WHERE kind = '{KIND}'")
        first.kill()
        second = start_worker(*FAST, "--worker-id", "second", env=env)
        wait_for(lambda: sweep_stuck_after(customers[99], "second", 2), 60, message="the second run to block")
        assert scalar("SELECT recoveries FROM jobs WHERE job_id = %s", [job_id]) == 1
        second.kill()
        third = start_worker(*FAST, "--worker-id", "third", env=env)
        wait_for(
            lambda: scalar("SELECT count(*) FROM dead_letters WHERE job_id = %s", [job_id]), 30, message="the letter"
        )
        cause, attempts, error = rows(
            "SELECT cause, attempts, last_error FROM dead_letters WHERE job_id = %s", [job_id]
        )[0]
        assert cause == "no_progress" and attempts == 2  # buried by the reaper, never handed to the third
        assert "2 times since its checkpoint last moved (recovery cap 1)" in error and customers[99] in error
        assert scalar("SELECT count(*) FROM jobs WHERE job_id = %s", [job_id]) == 0
        # Not seeded again while its letter waits for an operator: a fresh row would start at
        # the row that kills workers, and the cap would never stop it.
        time.sleep(3)  # several of the third worker's beats, each of which seeds what is missing
        assert scalar(f"SELECT count(*) FROM jobs WHERE kind = '{KIND}'") == 0
        assert third.proc.poll() is None
    finally:
        blocker.rollback()
        blocker.close()
