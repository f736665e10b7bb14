"""The queue port's conformance suite, run on both adapters (``postgres``, ``inprocess``):
what payment and webhook code may rely on whichever adapter the configuration chose.

The PostgreSQL adapter's jobs are worked by a real :class:`~jobs.runner.worker.Worker` on its own
thread and connection (its step method, until the queue is empty); the in-process
adapter's by its own thread, through the same ``jobs.runner.invoke.run_job``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings

from jobs import port, registry
from jobs.adapters.inprocess import InProcessQueue
from jobs.port import EnqueueError, JobRequest, PostgresQueue
from jobs.runner.outcome import Outcome
from jobs.runner.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


def task(name: str, *args) -> dict:
    return {"task": f"tests.tasks.{name}", "args": list(args), "kwargs": {}}


class Harness:
    """An adapter behind the port, and a way to work its jobs until none is left."""

    def __init__(self, adapter) -> None:
        self.adapter = adapter

    def run_jobs(self, timeout: float = 15.0) -> None:
        """Work every job due within a second, on another thread and connection (so an open
        transaction here hides nothing from the adapter, as a separate worker would see it)."""
        thread = threading.Thread(target=self._work, args=(timeout,))
        thread.start()
        thread.join()

    def _work(self, timeout: float) -> None:
        try:
            if isinstance(self.adapter, InProcessQueue):
                assert self.adapter.wait_idle(timeout, within=1.0), "the in-process queue did not go idle"
                return
            worker = Worker(worker_id="port-conformance")
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if worker.run_once() == 0:
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT count(*) FROM jobs WHERE run_at <= now() + interval '1 second'")
                        if cursor.fetchone()[0] == 0:
                            return
                    time.sleep(0.02)
        finally:
            connection.close()


@pytest.fixture(params=["postgres", "inprocess"])
def harness(request, effects):
    adapter = PostgresQueue() if request.param == "postgres" else InProcessQueue()
    # Retries within the test's patience: the task kind reads its policy at use.
    with (
        override_settings(VPAY_TASK_MAX_ATTEMPTS=3, VPAY_TASK_RETRY_BASE_SECONDS=0.05, VPAY_TASK_RETRY_CAP_SECONDS=0.1),
        port.use(adapter),
    ):
        yield Harness(adapter)
    if isinstance(adapter, InProcessQueue):
        adapter.stop()


def test_a_job_enqueued_in_a_transaction_runs_only_after_the_commit(harness, effects):
    with transaction.atomic():
        assert port.enqueue("task", task("record", "port:commit"), dedupe_key="port:commit") is not None
        harness.run_jobs(timeout=2.0)
        assert effects("port:") == []
    harness.run_jobs()
    assert effects("port:") == [("port:commit", "")]


def test_a_job_enqueued_in_a_rolled_back_transaction_never_runs(harness, effects):
    with pytest.raises(RuntimeError), transaction.atomic():
        port.enqueue("task", task("record", "port:rollback"), dedupe_key="port:rollback")
        raise RuntimeError("the business write failed")
    harness.run_jobs()
    assert effects("port:") == []
    # The name is not held by the job that never was.
    assert port.enqueue("task", task("record", "port:rollback"), dedupe_key="port:rollback") is not None


def test_a_name_enqueued_twice_runs_once(harness, effects):
    with transaction.atomic():
        assert port.enqueue("task", task("record", "port:twice", "first"), dedupe_key="port:twice") is not None
        assert port.enqueue("task", task("record", "port:twice", "second"), dedupe_key="port:twice") is None
    assert port.enqueue("task", task("record", "port:twice", "third"), dedupe_key="port:twice", delay=0) is None
    harness.run_jobs()
    assert effects("port:") == [("port:twice", "first")]


def test_enqueue_many_counts_only_the_new_names(harness, effects):
    requests = [JobRequest("task", task("record", f"port:many{i}"), dedupe_key=f"port:many{i}") for i in (1, 2, 1)]
    assert port.enqueue_many(requests) == 2
    harness.run_jobs()
    assert sorted(effects("port:")) == [("port:many1", ""), ("port:many2", "")]


def test_a_failing_job_is_retried_per_its_kinds_policy_then_frees_its_name(harness, tmp_path):
    marks = tmp_path / "attempts"
    port.enqueue("task", task("append_then_fail_until", str(marks), "x", 99), dedupe_key="port:fail")
    harness.run_jobs()
    assert marks.read_text() == "xxx"  # VPAY_TASK_MAX_ATTEMPTS=3, then a dead letter
    assert port.enqueue("task", task("record", "port:fail"), dedupe_key="port:fail") is not None


def test_a_job_whose_first_run_fails_is_delivered_again_and_its_effect_lands(harness, effects, tmp_path):
    marks = tmp_path / "attempts"
    port.enqueue("task", task("append_then_fail_until", str(marks), "x", 2), dedupe_key="port:again")
    harness.run_jobs()
    assert marks.read_text() == "xx"  # at least once: the failed delivery was not the last


def test_the_handler_gets_its_payload(harness, effects):
    port.enqueue("task", task("record", "port:payload", 'héllo, 世界 "quoted"'), dedupe_key="port:payload")
    harness.run_jobs()
    assert effects("port:") == [("port:payload", 'héllo, 世界 "quoted"')]


def test_pull_forward_makes_a_delayed_job_due_now(harness, effects):
    port.enqueue("task", task("record", "port:later"), dedupe_key="port:later", delay=3600)
    harness.run_jobs(timeout=2.0)
    assert effects("port:") == []
    assert port.pull_forward("port:later") is True
    harness.run_jobs()
    assert effects("port:") == [("port:later", "")]
    assert port.pull_forward("port:later") is False  # finished: nothing waits under that name


def test_pull_forward_waiting_moves_the_first_names_in_order_that_can_move(harness, effects):
    port.enqueue("task", task("record", "port:due"), dedupe_key="port:due")  # already due: cannot move
    port.enqueue("task", task("record", "port:b"), dedupe_key="port:b", delay=3600)
    port.enqueue("task", task("record", "port:c"), dedupe_key="port:c", delay=3600)
    assert port.pull_forward_waiting(["port:missing", "port:due", "port:b", "port:c"]) == ["port:b"]
    harness.run_jobs(timeout=2.0)
    assert sorted(effects("port:")) == [("port:b", ""), ("port:due", "")]  # c still waits an hour
    assert port.pull_forward_waiting(["port:b", "port:missing"]) == []
    assert port.pull_forward_waiting([]) == []
    assert port.pull_forward_waiting(["port:c"], 0) == []
    assert port.pull_forward_waiting(["port:c"]) == ["port:c"]
    odd = 'port:a "quoted", {braced} \\ name'  # every character an array literal must escape
    port.enqueue("task", task("record", "port:odd"), dedupe_key=odd, delay=3600)
    port.enqueue("task", task("record", "port:e"), dedupe_key="port:e", delay=3600)
    port.enqueue("task", task("record", "port:f"), dedupe_key="port:f", delay=3600)
    assert port.pull_forward_waiting(["port:missing", "port:f", odd, "port:e"], 2) == ["port:f", odd]


def waking_handler(monkeypatch, answer, floor: float = 0, fenced: bool = False, wake=None):
    """The task kind (unfenced unless asked), run by a handler that pulls its own job forward
    (or calls ``wake``) while it runs and gives ``answer`` on its first run, done on the next;
    its runs, and what each pull said."""
    runs: list[bool] = []

    def handler(ctx):
        if runs:
            runs.append(True)
            return Outcome.done()
        runs.append(wake() if wake else port.pull_forward("port:woken", floor))
        return answer

    spec = registry.get("task")
    monkeypatch.setitem(registry._REGISTRY, "task", dataclasses.replace(spec, handler=handler, fenced=fenced))
    port.enqueue("task", task("noop"), dedupe_key="port:woken")
    return runs


def test_a_job_woken_while_it_runs_runs_again_at_once_though_it_asked_for_an_hour(harness, monkeypatch):
    # What an emit during the fan-out drain's empty pass, or a confirm finishing while its
    # poll waits, relies on: the wake is not lost to the running job's reschedule.
    runs = waking_handler(monkeypatch, Outcome.reschedule_in(3600))
    harness.run_jobs()
    assert runs == [True, True]


def test_enqueue_or_wake_enqueues_a_missing_name_and_makes_a_waiting_one_due(harness, effects):
    port.enqueue("task", task("record", "port:later"), dedupe_key="port:later", delay=3600)
    port.enqueue_or_wake("task", task("record", "port:later"), dedupe_key="port:later")
    port.enqueue_or_wake("task", task("record", "port:new"), dedupe_key="port:new")
    harness.run_jobs()
    assert sorted(effects("port:")) == [("port:later", ""), ("port:new", "")]


def test_a_job_woken_while_it_runs_runs_again_after_it_finishes(harness, monkeypatch):
    # What a resent webhook delivery relies on when the run that ended it still holds its job.
    runs = waking_handler(monkeypatch, Outcome.done())
    harness.run_jobs()
    assert runs == [True, True]


def test_a_running_job_enqueue_or_wake_finds_runs_again_after_it_finishes(harness, monkeypatch):
    # The resend's wake of a job still running (each adapter's run_again), not only pull_forward.
    runs = waking_handler(monkeypatch, Outcome.done(), wake=lambda: port.adapter().run_again("port:woken"))
    harness.run_jobs()
    assert runs == [True, True]


def test_a_fenced_job_woken_while_it_runs_is_not_run_again_after_it_finishes(harness, monkeypatch, caplog):
    # Its job_id is processed once: a run again under it would be refused as a duplicate.
    runs = waking_handler(monkeypatch, Outcome.done(), fenced=True)
    with caplog.at_level("INFO", logger="jobs.runner.worker"):
        harness.run_jobs(timeout=2.0)
    assert runs == [True]
    assert "duplicate job skipped by the fence" not in caplog.messages  # not even run to be refused


def test_a_wake_never_cuts_short_a_deferral(harness, monkeypatch):
    runs = waking_handler(monkeypatch, Outcome.defer(3600, "breaker open"))
    harness.run_jobs(timeout=2.0)
    assert runs == [True]


def test_a_pull_forward_with_a_floor_never_wakes_a_running_job(harness, monkeypatch):
    runs = waking_handler(monkeypatch, Outcome.reschedule_in(3600), floor=10)
    harness.run_jobs(timeout=2.0)
    assert runs == [False]


def test_a_job_that_heartbeats_and_answers_reschedule_keeps_its_name_live(harness):
    # sweep_expired heartbeats after each step and reschedules itself an hour out.
    assert port.enqueue("sweep_expired", {}, dedupe_key="port:sweep") is not None
    harness.run_jobs()
    assert port.enqueue("sweep_expired", {}, dedupe_key="port:sweep") is None


def test_a_job_without_a_name_is_refused_and_nothing_runs(harness, effects):
    with pytest.raises(EnqueueError, match="deterministic name"):
        port.enqueue("task", task("record", "port:anonymous"), dedupe_key="")
    with pytest.raises(EnqueueError, match="deterministic name"):
        port.enqueue_many([JobRequest("task", task("record", "port:anonymous"))])
    harness.run_jobs(timeout=2.0)
    assert effects("port:") == []


def test_an_invalid_request_is_refused_as_the_queue_refuses_it(harness):
    with pytest.raises(EnqueueError, match="unknown job kind"):
        port.enqueue("no_such_kind", {}, dedupe_key="port:unknown")
    with pytest.raises(EnqueueError, match="not JSON-serializable"):
        port.enqueue("task", task("record", object()), dedupe_key="port:unserializable")


# --- configuration ---------------------------------------------------------------------------


def test_the_configured_adapter_is_postgres_by_default():
    assert port.adapter().name == "postgres" and port.adapter().durable


def test_payment_and_webhook_code_reach_the_queue_only_through_the_port():
    offenders = [
        str(path.relative_to(ROOT))
        for app in ("charges", "webhooks")
        for path in (ROOT / app).rglob("*.py")
        if "jobs.adapters.postgres" in path.read_text() or "from jobs.adapters import postgres" in path.read_text()
    ]
    assert offenders == []


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    from tests.conftest import database_url
    from tests.test_live_mode import FERNET_KEY

    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SECRET_KEY": "x" * 50,
            "VPAY_SECRETS_KEY": FERNET_KEY,
            "DATABASE_URL": database_url(),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_live_mode_refuses_the_in_process_adapter_and_names_the_setting():
    result = _manage("check", VPAY_LIVE_MODE="true", VPAY_QUEUE_ADAPTER="inprocess")
    assert result.returncode != 0
    assert "VPAY_QUEUE_ADAPTER=inprocess cannot be used in live mode" in result.stderr, result.stderr[-2000:]


def test_the_in_process_adapter_says_at_startup_that_it_is_not_durable():
    result = _manage("check", VPAY_QUEUE_ADAPTER="inprocess", VPAY_LOG_FORMAT="json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "NOT durable" in result.stdout + result.stderr
    quiet = _manage("check", VPAY_LOG_FORMAT="json")
    assert "NOT durable" not in quiet.stdout + quiet.stderr


def test_an_unknown_adapter_is_refused_by_name():
    result = _manage("check", VPAY_QUEUE_ADAPTER="redis")
    assert result.returncode != 0
    assert "VPAY_QUEUE_ADAPTER must be postgres or inprocess" in result.stderr


def test_pull_forward_waiting_deferred_only_moves_a_job_whose_last_run_deferred(harness, monkeypatch):
    # A run that made progress resets the deferrals (both adapters): a job deferred once and
    # since rescheduled on its own is not "deferred" any more.
    runs: dict[str, int] = {}

    def handler(ctx):
        name = ctx.payload["args"][0]
        runs[name] = runs.get(name, 0) + 1
        if name == "port:deferred" or (name == "port:progressed" and runs[name] == 1):
            return Outcome.defer(3600 if name == "port:deferred" else 0.05, "waiting for a slot")
        return Outcome.reschedule_in(3600)

    spec = registry.get("task")
    monkeypatch.setitem(registry._REGISTRY, "task", dataclasses.replace(spec, handler=handler, fenced=False))
    names = ["port:plain", "port:progressed", "port:deferred"]
    for name in names:
        port.enqueue("task", task("record", name), dedupe_key=name)
    harness.run_jobs(timeout=3.0)
    assert runs == {"port:plain": 1, "port:progressed": 2, "port:deferred": 1}
    assert port.pull_forward_waiting(names, 3, deferred_only=True) == ["port:deferred"]
    assert port.pull_forward_waiting(names, 3) == ["port:plain", "port:progressed"]
