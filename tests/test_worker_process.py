"""Rehearsals with real ``runworker`` processes: SIGKILL, SIGTERM drain, clock skew, a
Postgres blip, startup refusals, singleton seeding, ``--burst`` and ``--metrics-port``.

Every test here starts ``python manage.py runworker`` as a subprocess against the test
database (``start_worker`` in conftest) and judges it only by what the database holds,
the process's exit code and its log: no mocks, and every instant compared is the
database's own ``now()``.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from jobs import registry
from jobs.adapters.postgres import JobRequest, enqueue, enqueue_many
from tests.clock_support import skewed_env
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REPORT_LINE = re.compile(r"^runworker report: (.*)$", re.MULTILINE)


# --- helpers --------------------------------------------------------------------------


def sql(query: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def scalar(query: str, params=None):
    return sql(query, params)[0][0]


def task_request(task: str, *args, **options) -> JobRequest:
    return JobRequest(kind="task", payload={"task": f"tests.tasks.{task}", "args": list(args), "kwargs": {}}, **options)


def enqueue_task(task: str, *args, **options) -> None:
    enqueue("task", {"task": f"tests.tasks.{task}", "args": list(args), "kwargs": {}}, **options)


def effect_count(prefix: str) -> int:
    return scalar("SELECT count(*) FROM test_effects WHERE label LIKE %s", [prefix + "%"])


def duplicated_labels(prefix: str) -> list[tuple[str, int]]:
    return sql(
        "SELECT label, count(*) FROM test_effects WHERE label LIKE %s GROUP BY label HAVING count(*) > 1",
        [prefix + "%"],
    )


def leftover_jobs() -> list[tuple]:
    """The task rows still queued, as evidence when a test finds work left behind."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, locked_by, lease_expires_at < now(), run_at > now(), attempts, crashes, last_error"
            " FROM jobs WHERE kind = 'task' ORDER BY id"
        )
        return cursor.fetchall()


def task_rows() -> int:
    return scalar("SELECT count(*) FROM jobs WHERE kind = 'task'")


def dead_letters() -> list[tuple]:
    return sql("SELECT kind, cause, last_error FROM dead_letters")


def report_of(worker) -> dict[str, int]:
    """The ``runworker report:`` line of a finished worker, as a dict of counters."""
    match = REPORT_LINE.search(worker.output())
    assert match, f"no report line in the worker's output:\n{worker.output()[-3000:]}"
    return {k: int(v) for k, v in (pair.split("=") for pair in match.group(1).split())}


def log_records(worker) -> list[dict]:
    """The worker's JSON log lines (other lines, such as the report, are skipped)."""
    records = []
    for line in worker.output().splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def logged(worker, message: str) -> bool:
    return any(r.get("message", "").startswith(message) for r in log_records(worker))


def wait_started(worker, timeout: float = 30.0) -> None:
    """Until the worker logged ``worker started`` (booted, reaped, seeded, threads running)."""

    def started():
        assert worker.proc.poll() is None, f"worker exited early:\n{worker.output()[-3000:]}"
        return logged(worker, "worker started")

    wait_for(started, timeout=timeout, message="the worker to start")


def wait_exit(worker, timeout: float) -> int:
    try:
        return worker.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker still running after {timeout}s:\n{worker.output()[-3000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- 1. SIGKILL ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_backlog_survives_repeated_sigkills_with_every_effect_applied_exactly_once(effects, start_worker):
    total = 2000
    # A kill with several jobs running refunds their attempts (jobs.storage.leases, crash
    # attribution); the budget is raised all the same so no dead letter can hide
    # duplicates or gaps (the subject here).
    enqueue_many(task_request("record", f"kill-{i:05d}", max_attempts=20) for i in range(total))
    assert task_rows() == total

    killed_with_leases = 0
    for round_ in range(3):
        before = effect_count("kill-")
        worker = start_worker("--concurrency", "4", "--heartbeat", "0.5", "--worker-id", f"doomed-{round_}")
        # Kill mid-run: after this worker has visibly done some work, long before the end.
        wait_for(
            lambda before=before: effect_count("kill-") >= before + 150,
            timeout=60,
            message=f"worker {round_} to record 150 effects",
        )
        worker.kill()
        assert worker.proc.returncode == -signal.SIGKILL
        killed_with_leases += scalar("SELECT count(*) FROM jobs WHERE locked_by = %s", [f"doomed-{round_}"])

    done = effect_count("kill-")
    assert done < total, "the backlog ran out before the last kill; the rehearsal proves nothing"
    # The killed workers' leases are still held: nobody has settled them.
    assert killed_with_leases > 0
    # The replacement's reaper frees them once it has beaten on time for a lease of its own
    # (a reaper judges nobody sooner: jobs.maintenance.reaper), while it works through the backlog.
    replacement = start_worker("--concurrency", "4", "--heartbeat", "0.5", "--burst")
    assert wait_exit(replacement, timeout=120) == 0, replacement.output()[-3000:]
    messages = [r["message"] for r in log_records(replacement)]
    assert "rescued the jobs of a dead worker" in messages, messages[:10]

    assert duplicated_labels("kill-") == []
    left = leftover_jobs()
    assert scalar("SELECT count(DISTINCT label) FROM test_effects WHERE label LIKE 'kill-%'") == total, (
        left,
        replacement.output()[-3000:],
    )
    assert effect_count("kill-") == total
    assert task_rows() == 0
    assert dead_letters() == []
    assert scalar("SELECT count(*) FROM processed_jobs WHERE kind = 'task'") == total


# --- 2. SIGTERM drain ---------------------------------------------------------------------


def start_announced(tmp_path: Path, label: str, seconds: float) -> Path:
    """Enqueue ``record_slowly_announced``; returns the file its handler creates when it starts."""
    started = tmp_path / f"started-{label}"
    enqueue_task("record_slowly_announced", label, seconds, str(started))
    return started


def leased_tasks(prefix: str) -> int:
    return scalar(
        "SELECT count(*) FROM jobs WHERE kind = 'task' AND locked_at IS NOT NULL AND payload -> 'args' ->> 0 LIKE %s",
        [prefix + "%"],
    )


def test_sigterm_lets_in_flight_jobs_finish_once_then_exits_zero_with_a_report(effects, start_worker, tmp_path):
    # Three slow jobs and four executors: all three start at once.
    worker = start_worker("--concurrency", "4", "--grace", "20")
    wait_started(worker)
    markers = [start_announced(tmp_path, f"drain-{i}", 2) for i in range(3)]
    # In flight means the handlers run, not only that the rows are leased: a claimed job
    # that has not started is handed back at the signal, by design.
    wait_for(lambda: all(m.exists() for m in markers), timeout=15, message="three handlers running")
    assert leased_tasks("drain-") == 3
    assert effect_count("drain-") == 0

    worker.signal(signal.SIGTERM)
    # Claims stop at the signal: a job enqueued while the others drain stays queued, even
    # though the fourth executor is idle and the enqueue NOTIFYs it.
    time.sleep(0.5)
    enqueue_task("record", "drain-late")
    assert wait_exit(worker, timeout=15) == 0, worker.output()[-3000:]

    assert sorted(label for label, _ in effects("drain-")) == ["drain-0", "drain-1", "drain-2"]
    assert sql("SELECT payload -> 'args' ->> 0, attempts, locked_at FROM jobs WHERE kind = 'task'") == [
        ("drain-late", 0, None)
    ]
    assert dead_letters() == []
    report = report_of(worker)
    assert report["finished"] >= 3
    assert report["released"] == report["lost"] == report["unsettled"] == 0


@pytest.mark.slow
def test_a_handler_longer_than_grace_is_released_at_grace_and_a_second_worker_runs_it_once(
    effects, start_worker, tmp_path
):
    worker = start_worker("--concurrency", "2", "--grace", "1")
    wait_started(worker)
    marker = start_announced(tmp_path, "overlong", 7)
    wait_for(marker.exists, timeout=15, message="the long handler to start")

    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=15) == 0, worker.output()[-3000:]
    # Grace is 1 s; the handler had 7 s left. Exiting well before it would have ended
    # shows grace was enforced rather than the handler waited for.
    assert time.monotonic() - signalled < 6
    assert report_of(worker)["released"] >= 1
    assert logged(worker, "grace elapsed; released held leases")

    ((locked_at, lease_token, attempts, last_error),) = sql(
        "SELECT locked_at, lease_token, attempts, last_error FROM jobs WHERE kind = 'task'"
    )
    assert (locked_at, lease_token) == (None, None)
    assert attempts == 0  # a deploy is not its failure: the attempt is refunded
    assert "released at shutdown" in last_error
    assert effect_count("overlong") == 0  # the abandoned handler's transaction rolled back

    marker.unlink()
    second = start_worker("--concurrency", "2", "--burst")
    assert wait_exit(second, timeout=60) == 0, second.output()[-3000:]
    assert marker.exists()
    assert [label for label, _ in effects("overlong")] == ["overlong"]
    assert task_rows() == 0
    assert dead_letters() == []


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_second_signal_exits_at_once_with_a_nonzero_code_even_with_a_long_job(
    effects, start_worker, tmp_path, second
):
    worker = start_worker("--concurrency", "1", "--grace", "60")
    wait_started(worker)
    marker = start_announced(tmp_path, "stuck", 60)
    wait_for(marker.exists, timeout=15, message="the long handler to start")

    worker.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.proc.poll() is None, "the first signal must drain, not exit"
    signalled = time.monotonic()
    worker.signal(second)
    code = wait_exit(worker, timeout=10)
    assert code != 0
    assert time.monotonic() - signalled < 5
    assert logged(worker, "second signal: exiting now")
    # Nothing was settled or released: the lease is the reaper's to recover.
    assert leased_tasks("stuck") == 1
    assert effect_count("stuck") == 0


# --- 3. Clock skew ------------------------------------------------------------------------

TWO_HOURS = 7200


def clock_offset(worker) -> float:
    """The worker's wall clock minus the database's, read from its ``worker started`` line."""
    (started,) = [r for r in log_records(worker) if r["message"] == "worker started"]
    return scalar("SELECT extract(epoch FROM %s::timestamptz - now())::float8", [started["time"]])


def lease_of(label: str) -> tuple | None:
    rows = sql("SELECT locked_by, lease_token FROM jobs WHERE kind = 'task' AND payload -> 'args' ->> 0 = %s", [label])
    return rows[0] if rows else None


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["libfaketime", "sitecustomize"])
def test_workers_whose_clocks_are_hours_off_schedule_and_reap_on_the_database_clock(
    effects, start_worker, tmp_path, mechanism
):
    # fast: two hours ahead; runs the default queue, reaps every 2 s, retries with base 60 s.
    fast = start_worker(
        "--concurrency", "2", "--heartbeat", "1", "--worker-id", "fast-clock",
        env={**skewed_env(mechanism, TWO_HOURS, tmp_path), "VPAY_TASK_RETRY_BASE_SECONDS": "60"},
    )  # fmt: skip
    # slow: two hours behind; takes leases on the `slow` queue (8 s lease, from now()).
    slow = start_worker(
        "--concurrency", "1", "--queues", "slow", "--heartbeat", "3", "--worker-id", "slow-clock",
        env=skewed_env(mechanism, -TWO_HOURS, tmp_path),
    )  # fmt: skip
    # right: a correct clock, claiming nothing (queue `idle`), reaping every second.
    right = start_worker("--concurrency", "1", "--queues", "idle", "--heartbeat", "0.25", "--worker-id", "right-clock")
    for worker in (fast, slow, right):
        wait_started(worker)
    # The skew is real: each worker's own log clock is two hours off the database's.
    assert abs(clock_offset(fast) - TWO_HOURS) < 60
    assert abs(clock_offset(slow) + TWO_HOURS) < 60
    assert abs(clock_offset(right)) < 60

    enqueue_task("record", "skew-later", delay=30)
    enqueue_task("record", "skew-due")
    enqueue_task("fail_transiently", "skew-retry")
    enqueue_task("record_after_sql_sleep", "skew-leased", 4, queue="slow")

    # The fast-clock worker runs what is due, and leaves what is not: idle loops claim every
    # second, and two hours ahead, a job due in 30 s looks overdue.
    wait_for(lambda: effect_count("skew-due") == 1, timeout=15, message="the due job to run")
    time.sleep(2)
    assert sql("SELECT attempts, locked_at FROM jobs WHERE payload -> 'args' ->> 0 = 'skew-later'") == [(0, None)]
    # ...and its retry backoff is measured from the database's now(), within the policy's
    # ceiling for the attempt it spent (60 s * 2^(attempt-1)), not two hours out.
    retry = wait_for(
        lambda: sql(
            "SELECT attempts, extract(epoch FROM run_at - now())::float8 FROM jobs"
            " WHERE payload -> 'args' ->> 0 = 'skew-retry' AND locked_at IS NULL AND attempts >= 1"
            " AND run_at > now()"
        ),
        timeout=15,
        message="the failing job to be rescheduled into the future",
    )
    ((attempts, backoff),) = retry
    assert 0 < backoff <= 60 * 2 ** (attempts - 1)

    # The slow-clock worker holds an 8 s lease for a 4 s handler. The fast-clock reaper (every
    # 2 s) and the right-clock one (every 1 s) run meanwhile; neither may take it early.
    wait_for(lambda: lease_of("skew-leased")[0] == "slow-clock", timeout=15, message="the slow-clock worker to claim")
    lease = lease_of("skew-leased")
    while effect_count("skew-leased") == 0:
        current = lease_of("skew-leased")
        assert current in (lease, None), f"the lease was taken over early: {lease} -> {current}"
        time.sleep(0.1)
    wait_for(lambda: lease_of("skew-leased") is None, timeout=10, message="the slow-clock worker to settle")

    # Seconds have passed; the job due in 30 s is still waiting, untouched by the fast clock.
    assert sql("SELECT attempts, locked_at, run_at > now() FROM jobs WHERE payload -> 'args' ->> 0 = 'skew-later'") == [
        (0, None, True)
    ]
    assert effect_count("skew-later") == 0

    # A lease that really expired is reaped by a slow-clock worker alone (its clock says
    # the lease has two hours to go).
    for worker in (fast, right):
        worker.signal(signal.SIGTERM)
        assert wait_exit(worker, timeout=15) == 0, worker.output()[-3000:]
    enqueue_task("record", "skew-ghost", queue="ghost")
    sql(
        "UPDATE jobs SET locked_by = 'ghost', lease_token = gen_random_uuid(), locked_at = now(),"
        " heartbeat_at = now(), lease_expires_at = now() + interval '1 second', attempts = 1"
        " WHERE payload -> 'args' ->> 0 = 'skew-ghost' RETURNING id"
    )
    wait_for(lambda: lease_of("skew-ghost") == (None, None), timeout=15, message="the slow-clock worker to reap")

    slow.signal(signal.SIGTERM)
    assert wait_exit(slow, timeout=15) == 0, slow.output()[-3000:]
    assert report_of(slow)["finished"] >= 1
    for worker in (fast, slow, right):
        assert report_of(worker)["lost"] == 0
    assert [label for label, _ in effects("skew-leased")] == ["skew-leased"]
    assert dead_letters() == []


# --- 4. A Postgres blip -------------------------------------------------------------------


def terminate_backends(worker_id: str) -> int:
    """Kill every server backend of one worker process (its loops, listener, maintenance)."""
    return scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND (application_name LIKE %s OR application_name LIKE %s)",
        [f"vpay-worker:{worker_id}%", f"vpay-listen:{worker_id}%"],
    )


@pytest.mark.slow
def test_a_worker_survives_its_connections_being_terminated_idle_and_busy_and_keeps_working(effects, start_worker):
    worker_id = "blip"
    worker = start_worker(
        "--concurrency", "2", "--heartbeat", "0.5", "--worker-id", worker_id,
        env={"VPAY_TASK_RETRY_BASE_SECONDS": "1"},
    )  # fmt: skip
    wait_started(worker)

    # Idle: every connection dies under the waiting loops.
    # Killed again until an executor's claim meets a dead connection: on a loaded machine the
    # first kill can land before the idle executors have (re)connected, and only the listener
    # and the maintenance thread notice it.
    wait_for(lambda: terminate_backends(worker_id) >= 1, timeout=10, message="worker connections to kill")
    wait_for(
        lambda: logged(worker, "claim failed") or (terminate_backends(worker_id) and False),
        timeout=15,
        interval=0.5,
        message="the claim failure to be logged",
    )
    assert worker.proc.poll() is None
    enqueue_many(task_request("record", f"blip-idle-{i}") for i in range(20))
    wait_for(lambda: effect_count("blip-idle-") == 20, timeout=30, message="jobs enqueued after the blip to run")

    # Busy: connections die under running handlers, twice. The interrupted transactions roll
    # back; their jobs are handed back by their own worker with the attempt refunded (the
    # outage was not theirs), and run once. One attempt each: any attempt spent on the
    # outage would be a dead letter.
    enqueue_many(task_request("record_slowly", f"blip-busy-{i}", 0.1, max_attempts=1) for i in range(40))
    for _ in range(2):
        wait_for(lambda: leased_tasks("blip-busy-") >= 1, timeout=15, message="busy loops")
        assert terminate_backends(worker_id) >= 1
        time.sleep(0.5)
    assert worker.proc.poll() is None
    try:
        wait_for(lambda: effect_count("blip-busy-") == 40, timeout=60, message="every busy job to run")
    except pytest.fail.Exception:
        # Timed out once in a loaded full run (2026-12-05), never alone: say where the worker was.
        states = sql("SELECT attempts, locked_at IS NOT NULL, lease_expires_at > now() FROM jobs WHERE kind = 'task'")
        pytest.fail(f"{effect_count('blip-busy-')} of 40 ran; jobs left {states}\n{worker.output()[-4000:]}")
    wait_for(lambda: task_rows() == 0, timeout=30, message="every job to be settled")
    assert worker.proc.poll() is None, worker.output()[-3000:]
    assert duplicated_labels("blip-") == []
    assert dead_letters() == []

    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=15) == 0, worker.output()[-3000:]


# --- 5. Startup refusals ------------------------------------------------------------------


def test_runworker_refuses_to_start_against_a_database_with_a_migration_it_does_not_know(start_worker):
    sql("INSERT INTO django_migrations (app, name, applied) VALUES ('jobs', '9999_future', now())")
    try:
        worker = start_worker("--burst")
        code = wait_exit(worker, timeout=30)
    finally:
        sql("DELETE FROM django_migrations WHERE app = 'jobs' AND name = '9999_future'")
    output = worker.output()
    assert code != 0, output
    assert "refusing to start" in output
    assert "jobs.9999_future" in output
    assert not logged(worker, "worker started")


def test_runworker_refuses_to_start_while_a_migration_is_unapplied(start_worker):
    ((row_id, name, applied),) = sql(
        "DELETE FROM django_migrations WHERE id = (SELECT max(id) FROM django_migrations WHERE app = 'jobs')"
        " RETURNING id, name, applied"
    )
    try:
        worker = start_worker("--burst")
        code = wait_exit(worker, timeout=30)
    finally:
        sql(
            "INSERT INTO django_migrations (id, app, name, applied) VALUES (%s, 'jobs', %s, %s)",
            [row_id, name, applied],
        )
    output = worker.output()
    assert code != 0, output
    assert "refusing to start" in output
    assert f"unapplied migrations: jobs.{name}" in output
    assert not logged(worker, "worker started")


def test_runworker_refuses_to_start_with_a_fence_ttl_shorter_than_the_retry_window(start_worker):
    worker = start_worker("--burst", env={"VPAY_PROCESSED_JOBS_TTL_SECONDS": "60"})
    code = wait_exit(worker, timeout=30)
    output = worker.output()
    assert code != 0, output
    assert "VPAY_PROCESSED_JOBS_TTL_SECONDS" in output
    assert not logged(worker, "worker started")
    assert scalar("SELECT count(*) FROM jobs") == 0  # it did not even seed its singletons


# --- 6. Singletons ------------------------------------------------------------------------


def test_three_workers_booting_at_once_seed_exactly_one_sweep_job(start_worker):
    workers = [start_worker("--burst", "--concurrency", "1") for _ in range(3)]
    for worker in workers:
        assert wait_exit(worker, timeout=60) == 0, worker.output()[-3000:]
    assert sql(
        "SELECT dedupe_key, locked_at, run_at - now() > interval '50 minutes' FROM jobs WHERE kind = 'sweep_expired'"
    ) == [("singleton:sweep_expired", None, True)]
    # Every singleton has one live row, however many workers seeded it.
    assert sql("SELECT dedupe_key FROM jobs GROUP BY dedupe_key HAVING count(*) > 1") == []
    singletons = {spec.kind.value for spec in registry.all_specs() if spec.singleton is not None}
    assert {"sweep_expired", "sweep_idle_customers"} <= singletons
    assert set(sql("SELECT kind FROM jobs WHERE dedupe_key LIKE 'singleton:%'")) == {(k,) for k in singletons}
    # The sweep ran once, in one of the three bursts, and rescheduled itself an hour out.
    sweeps = [r for w in workers for r in log_records(w) if r["message"] == "sweep_expired"]
    assert len(sweeps) == 1


# --- 7. --burst and --metrics-port --------------------------------------------------------


def test_burst_on_an_empty_queue_exits_zero_quickly(start_worker):
    started = time.monotonic()
    worker = start_worker("--burst")
    assert wait_exit(worker, timeout=30) == 0, worker.output()[-3000:]
    # Boot (Django, checks, reap, seed) plus one empty claim per loop: seconds, not an idle wait.
    assert time.monotonic() - started < 15
    # It claimed nothing but the singleton jobs it seeded itself.
    assert report_of(worker)["claimed"] <= scalar("SELECT count(*) FROM jobs WHERE dedupe_key LIKE 'singleton:%'")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_port_serves_jobs_total_by_kind_and_disposition(effects, start_worker):
    port = free_port()
    worker = start_worker("--concurrency", "2", "--metrics-port", str(port))
    wait_started(worker)
    enqueue_many(task_request("record", f"metric-{i}") for i in range(5))
    enqueue_task("fail_permanently", "metric-bad")
    wait_for(lambda: effect_count("metric-") == 5 and task_rows() == 0, timeout=30, message="the jobs to run")

    finished = ("vpay_jobs_total", (("disposition", "finished"), ("kind", "task")))
    dead = ("vpay_jobs_total", (("disposition", "dead_lettered"), ("kind", "task")))
    samples = wait_for(
        lambda: (s := scrape(port)).get(finished) == 5 and s.get(dead) == 1 and s,
        timeout=15,
        message="vpay_jobs_total to count the settled jobs",
    )
    assert samples[finished] == 5.0
    assert samples[dead] == 1.0

    worker.signal(signal.SIGTERM)
    assert wait_exit(worker, timeout=15) == 0, worker.output()[-3000:]


def test_an_executor_killed_by_a_task_stops_the_worker_with_a_non_zero_exit_and_an_alert(start_worker):
    from tests.tasks import exit_the_process

    job_id = exit_the_process.enqueue().id
    worker = start_worker("--burst", "--concurrency", "2")
    # SystemExit is not an Exception: it escapes per-job handling and kills its executor.
    # The worker must not run on silently with fewer executors: it stops and exits non-zero.
    assert wait_exit(worker, timeout=30) != 0
    output = worker.output()
    died = [json.loads(line) for line in output.splitlines() if '"a worker thread died; stopping the worker"' in line]
    assert died and died[0]["alert"] is True and died[0]["thread_name"].startswith("vpay-exec-")
    # The job is not lost: its lease is left for the reaper (or was released by the drain).
    assert scalar("SELECT count(*) FROM jobs WHERE job_id = %s", [job_id]) == 1


def test_the_worker_session_allows_idle_in_transaction_for_its_longest_lease(start_worker, effects):
    from jobs import registry
    from tests.tasks import record_setting

    record_setting.enqueue("idle-timeout", "idle_in_transaction_session_timeout")
    worker = start_worker("--burst")
    assert wait_exit(worker, timeout=30) == 0, worker.output()[-3000:]
    longest_lease = max(spec.lease_seconds for spec in registry.all_specs())
    # A fenced handler's transaction stays open up to its timeout: the server must not kill
    # it as idle before the lease (the web process keeps the shorter default).
    ((_label, value),) = effects("idle-timeout")
    assert value == f"{int(longest_lease)}s"
