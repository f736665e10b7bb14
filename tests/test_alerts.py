"""Alerts: each new dead letter (and each key an app raises) is logged once and POSTed once,
with its own retry, through a real local HTTP endpoint; racing writers and racing workers
still make one alert; a failing endpoint never loses the dead letter nor leaks its token."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import threading

import pytest
from django.db import connection, transaction

from jobs.adapters import postgres as queue
from jobs.models import Alert, DeadLetter, DeadLetterState
from jobs.operator import alert_sql, alerts
from jobs.operator.alerts import ALERT_RETRY, raise_alert
from jobs.runner.worker import Worker
from tests import tasks
from tests.alert_endpoint import TOKEN, AlertEndpoint
from tests.conftest import wait_for
from tests.queue_support import claim, count, execute, expire_lease, make_due, scalar, task_payload

# Lock waits in this test's database only (another xdist worker's database shares the server).
WAITING_HERE = (
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE NOT l.granted AND a.datname = current_database()"
)


def second_is_waiting() -> bool:
    """Whether a session of this database waits on a lock, asked from inside a transaction:
    pg_stat_activity is read once per transaction and kept, so without clearing it a session
    that connected after the transaction's first look is never seen (the wait ran into the
    second's statement timeout once)."""
    scalar("SELECT pg_stat_clear_snapshot()")
    return scalar(WAITING_HERE) > 0


def alert_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "alert", False) and r.name == "jobs.operator.alerts"]


def dead_letter_a_task(label: str = "boom") -> DeadLetter:
    """A task that fails for good, run by the in-process worker: one dead letter."""
    result = tasks.fail_permanently.enqueue(label)
    worker = Worker(concurrency=1, queues=["default"])
    assert worker.run_once() == 1
    return DeadLetter.objects.get(job_id=result.id)


def run_alert_jobs() -> int:
    """Run the claimable send_alert jobs (on their own queue here) once; how many ran."""
    return Worker(concurrency=1, queues=["alerts"]).run_once()


@pytest.fixture
def alert_settings(settings):
    settings.VPAY_ALERT_QUEUE = "alerts"
    settings.VPAY_PUBLIC_URL = "https://ops.example.test"
    settings.ALERT_WEBHOOK_URL = ""
    return settings


# --- one dead letter, one alert --------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_dead_letter_is_logged_and_posted_exactly_once(alert_settings, caplog):
    caplog.set_level(logging.INFO)
    with AlertEndpoint() as endpoint:
        alert_settings.ALERT_WEBHOOK_URL = endpoint.url
        letter = dead_letter_a_task("card-9")
        # Written with the dead letter: its alert row and the job that sends it.
        alert = Alert.objects.get(key=f"dead_letter:{letter.pk}")
        assert count("jobs", "kind = 'send_alert' AND queue = 'alerts' AND dedupe_key = %s", [f"alert:{alert.pk}"]) == 1
        assert alert_lines(caplog) == [] and endpoint.received == []

        assert run_alert_jobs() == 1
        (request,) = endpoint.received
        body = request["body"]
        assert body["title"] == f"Dead letter {letter.pk}: task on default (permanent)"
        assert (body["severity"], body["job_kind"], body["dead_letter_id"]) == ("error", "task", letter.pk)
        assert body["link"] == f"https://ops.example.test/admin/jobs/deadletter/{letter.pk}/change/"
        assert body["dedup_key"] == f"vpay:dead_letter:{letter.pk}"
        assert request["headers"]["Idempotency-Key"] == body["dedup_key"]
        assert body["details"]["cause"] == "permanent" and body["details"]["job_id"] == str(letter.job_id)

        (line,) = alert_lines(caplog)
        assert line.alert_id == alert.pk and line.details["dead_letter_id"] == letter.pk
        # The worker's own dead-letter line no longer carries alert=true: one alert, not two.
        (worker_line,) = [r for r in caplog.records if r.getMessage() == "job dead-lettered"]
        assert worker_line.alert is False
        alert.refresh_from_db()
        assert alert.logged_at is not None and alert.sent_at is not None and alert.send_attempts == 1

        # The job run again (a redelivery, a replay of it) neither logs nor posts again.
        queue.enqueue("send_alert", {"alert_id": alert.pk}, queue="alerts")
        assert run_alert_jobs() == 1
        assert len(endpoint.received) == 1 and len(alert_lines(caplog)) == 1


@pytest.mark.django_db
def test_without_a_webhook_url_the_alert_is_a_log_line_only(alert_settings, caplog):
    caplog.set_level(logging.INFO)
    letter = dead_letter_a_task()
    assert run_alert_jobs() == 1
    (line,) = alert_lines(caplog)
    assert line.levelno == logging.ERROR and f"Dead letter {letter.pk}" in line.getMessage()
    alert = Alert.objects.get()
    assert alert.logged_at is not None and alert.sent_at is None
    assert count("jobs") == 0


@pytest.mark.django_db
def test_a_configuration_dead_letter_pages(alert_settings):
    result = tasks.fail_with_configuration_error.enqueue("creds")
    Worker(concurrency=1, queues=["default"]).run_once()
    alert = Alert.objects.get()
    assert alert.severity == "page"
    assert alerts.incident_body(alert_sql.get_alert(alert.pk))["severity"] == "critical"
    assert DeadLetter.objects.get(job_id=result.id).cause == "configuration"


@pytest.mark.django_db
def test_the_reaper_raises_the_alert_of_a_job_that_died_on_its_last_attempt(alert_settings):
    job_id = queue.enqueue("task", task_payload(), max_attempts=1)
    claim()
    expire_lease(job_id)
    assert Worker(concurrency=1).reap() == (0, 1)
    letter = DeadLetter.objects.get(job_id=job_id)
    alert = Alert.objects.get()
    assert (alert.key, alert.details["cause"]) == (f"dead_letter:{letter.pk}", "crashed_worker")
    assert count("jobs", "kind = 'send_alert'") == 1


# --- a failing endpoint -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failing_endpoint_is_retried_until_it_answers_and_the_dead_letter_stays(alert_settings, caplog):
    caplog.set_level(logging.INFO)
    with AlertEndpoint([500, 503, 202]) as endpoint:
        alert_settings.ALERT_WEBHOOK_URL = endpoint.url
        letter = dead_letter_a_task()
        for attempt in range(3):
            assert run_alert_jobs() == 1
            if attempt < 2:
                alert = Alert.objects.get()
                assert alert.sent_at is None and f"HTTP {(500, 503)[attempt]}" in alert.last_error
                make_due()  # skip the backoff
        assert len(endpoint.received) == 3
        assert len({json.dumps(b, sort_keys=True) for b in endpoint.bodies()}) == 1  # the same document each time
    alert = Alert.objects.get()
    assert alert.sent_at is not None and alert.send_attempts == 3 and alert.last_error == ""
    assert len(alert_lines(caplog)) == 1  # logged once, however many POSTs it took
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW
    assert count("jobs") == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_an_endpoint_that_stays_down_dead_letters_the_alert_job_only_once_and_never_leaks_its_token(
    alert_settings, caplog
):
    caplog.set_level(logging.INFO)
    alert_settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{closed_port()}/hooks/{TOKEN}?token={TOKEN}"
    letter = dead_letter_a_task()
    for _ in range(ALERT_RETRY.max_attempts):
        assert run_alert_jobs() == 1
        make_due()
    assert run_alert_jobs() == 0

    # The alert job is now a dead letter of its own, replayable, and alerted by the worker's
    # log line: no alert about the alert (the endpoint is down; that would never end).
    stuck = DeadLetter.objects.get(kind="send_alert")
    assert (stuck.cause, stuck.attempts) == ("exhausted", ALERT_RETRY.max_attempts)
    assert Alert.objects.count() == 1
    (line,) = [r for r in caplog.records if r.getMessage() == "job dead-lettered" and r.kind == "send_alert"]
    assert line.alert is True
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW  # the original dead letter is intact
    alert = Alert.objects.get()
    assert alert.sent_at is None and alert.send_attempts == ALERT_RETRY.max_attempts
    assert "unreachable" in alert.last_error
    # The token is in no log line, no stored error and no dead letter.
    logged = "\n".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert TOKEN not in logged
    assert TOKEN not in alert.last_error and TOKEN not in stuck.last_error


@pytest.mark.django_db
def test_an_endpoint_refusing_the_request_is_a_configuration_error_at_once(alert_settings):
    with AlertEndpoint([401]) as endpoint:
        alert_settings.ALERT_WEBHOOK_URL = endpoint.url
        dead_letter_a_task()
        assert run_alert_jobs() == 1
        assert len(endpoint.received) == 1
    stuck = DeadLetter.objects.get(kind="send_alert")
    assert (stuck.cause, stuck.attempts) == ("configuration", 1)
    assert "HTTP 401" in stuck.last_error and TOKEN not in stuck.last_error


def test_scrub_removes_every_part_of_the_url_that_can_hold_a_token():
    url = f"https://user:pa55word@alerts.example/v2/{TOKEN}/x?routing_key={TOKEN}"
    text = f"ConnectError: failed for {url} (path /v2/{TOKEN}/x) key={TOKEN} pa55word"
    scrubbed = alerts._scrub(text, url)
    assert TOKEN not in scrubbed and "pa55word" not in scrubbed
    assert "[ALERT_WEBHOOK_URL]" in scrubbed


# --- the API other apps call ----------------------------------------------------------------


@pytest.mark.django_db
def test_raise_alert_writes_one_alert_per_key_in_the_callers_transaction(alert_settings):
    with transaction.atomic():
        first = raise_alert(key="charge_unresolved:ch_1", title="Charge ch_1 unresolved", source="charges.unresolved")
        again = raise_alert(key="charge_unresolved:ch_1", title="again", source="charges.unresolved")
    assert first is not None and again is None
    assert Alert.objects.get().title == "Charge ch_1 unresolved"
    assert count("jobs", "kind = 'send_alert'") == 1

    # Rolled back with the caller: no alert for work that did not commit.
    with pytest.raises(RuntimeError, match="business rollback"), transaction.atomic():
        raise_alert(key="delivery_exhausted:we_1", title="t", source="webhooks.delivery_exhausted")
        raise RuntimeError("business rollback")
    assert not Alert.objects.filter(key="delivery_exhausted:we_1").exists()
    assert count("jobs", "kind = 'send_alert'") == 1


@pytest.mark.django_db
def test_raise_alert_refuses_bad_arguments_before_writing():
    with transaction.atomic():
        with pytest.raises(ValueError, match="severity"):
            raise_alert(key="k", title="t", source="s", severity="loud")
        with pytest.raises(ValueError, match="key"):
            raise_alert(key=" ", title="t", source="s")
        with pytest.raises(ValueError, match="details"):
            raise_alert(key="k", title="t", source="s", details={"x": float("nan")})
    assert Alert.objects.count() == 0


def test_raise_alert_outside_a_transaction_is_refused():
    with pytest.raises(RuntimeError, match="inside the transaction"):
        raise_alert(key="k", title="t", source="s")


@pytest.mark.django_db
def test_an_alert_raised_by_an_app_is_sent_with_its_link_made_absolute(alert_settings):
    with AlertEndpoint() as endpoint:
        alert_settings.ALERT_WEBHOOK_URL = endpoint.url
        with transaction.atomic():
            raise_alert(
                key="delivery_exhausted:we_7",
                title="Webhook delivery we_7 exhausted its retries",
                source="webhooks.delivery_exhausted",
                severity="warning",
                details={"delivery_id": "we_7"},
                link="/admin/webhooks/delivery/7/change/",
            )
        assert run_alert_jobs() == 1
        (body,) = endpoint.bodies()
    assert (body["severity"], body["component"], body["details"]) == (
        "warning",
        "webhooks.delivery_exhausted",
        {"delivery_id": "we_7"},
    )
    assert body["link"] == "https://ops.example.test/admin/webhooks/delivery/7/change/"
    assert "dead_letter_id" not in body


# --- races --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_transactions_racing_to_raise_the_same_key_make_one_alert(alert_settings):
    first_inserted = threading.Event()
    results: dict[str, int | None] = {}
    errors: list[BaseException] = []

    def first():
        try:
            with transaction.atomic():
                results["first"] = raise_alert(key="race:1", title="t", source="tests.race")
                first_inserted.set()
                # Hold the transaction open while the second one tries the same key.
                wait_for(second_is_waiting, timeout=30, message="the second to wait on the key")
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    def second():
        try:
            first_inserted.wait(30)
            with transaction.atomic():
                results["second"] = raise_alert(key="race:1", title="t", source="tests.race")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert results["first"] is not None and results["second"] is None
    assert Alert.objects.filter(key="race:1").count() == 1
    assert count("jobs", "kind = 'send_alert'") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_two_real_workers_racing_over_failing_jobs_send_one_alert_per_dead_letter(start_worker):
    total = 30
    queue.enqueue_many(
        queue.JobRequest("task", task_payload("tests.tasks.fail_permanently", f"race-{i}")) for i in range(total)
    )
    with AlertEndpoint() as endpoint:
        env = {"ALERT_WEBHOOK_URL": endpoint.url, "VPAY_PUBLIC_URL": "https://ops.example.test"}
        workers = [start_worker("--concurrency", "2", env=env) for _ in range(2)]
        wait_for(
            lambda: scalar("SELECT count(*) FROM alerts WHERE sent_at IS NOT NULL") == total,
            timeout=90,
            message=f"{total} alerts sent",
        )
        # A worker still booting when SIGTERM arrives dies of it (-15) instead of draining:
        # signal only once both are running (a loaded machine can boot one late).
        for worker in workers:
            wait_for(lambda w=worker: '"worker started"' in w.output(), timeout=60, message="worker started")
        for worker in workers:
            worker.signal(signal.SIGTERM)
        # Each drains within its grace (30 s by default) and exits 0; past that and a margin,
        # the failure says where each worker was (it once took longer in a loaded full run).
        try:
            codes = [worker.wait(45) for worker in workers]
        except subprocess.TimeoutExpired:
            pytest.fail("a worker did not exit:\n" + "\n---\n".join(w.output()[-4000:] for w in workers))
        assert codes == [0, 0]
        bodies = endpoint.bodies()

    letters = set(DeadLetter.objects.values_list("pk", flat=True))
    assert len(letters) == total
    assert len(bodies) == total
    assert {b["dead_letter_id"] for b in bodies} == letters  # each one, once
    alert_logs = [
        json.loads(line)
        for worker in workers
        for line in worker.output().splitlines()
        if line.startswith("{") and '"alert": true' in line
    ]
    assert {entry["logger"] for entry in alert_logs} == {"jobs.operator.alerts"}  # one alert line each, no other
    assert sorted(entry["alert_id"] for entry in alert_logs) == sorted(Alert.objects.values_list("pk", flat=True))
    assert TOKEN not in "".join(worker.output() for worker in workers)
    assert count("jobs", "kind IN ('task', 'send_alert')") == 0
    execute("DELETE FROM alerts")
