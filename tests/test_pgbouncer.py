"""vpay behind a real PgBouncer in transaction mode (Debian's 1.18, tests/pgbouncer_support.py).

A gunicorn web process and ``runworker`` processes reach the database only through the
pooler (``VPAY_DB_POOLER=transaction``), with a pool smaller than their connections, so
server sessions are shared between clients: a statement prepared on the server, a session
SET or a LISTEN would show up here as an error or a lost wake-up. The timeouts come from the
role (``manage.py dbroletimeouts --apply``); the suite sets them on the test database for
the test and takes them off after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from jobs import registry
from merchants.services import create_merchant
from tests.charges_support import FAST_POLICY, scalar, sql, use_rails, worker_env
from tests.conftest import database_url, wait_for
from tests.pgbouncer_support import PgBouncer, free_port
from tests.test_worker_process import log_records, wait_exit, wait_started
from vpay import db_role

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
POOL_SIZE = 4


@pytest.fixture
def pooler():
    """PgBouncer in front of the test database, and the role's timeouts set for it."""
    s = connection.settings_dict
    bouncer = PgBouncer(
        s["HOST"] or s["OPTIONS"].get("host") or "127.0.0.1", int(s["PORT"] or 5432), s["USER"], pool_size=POOL_SIZE
    )
    current = db_role.current_timeouts()
    with connection.cursor() as cursor:
        for statement in db_role.statements(current["role"], current["database"]):
            cursor.execute(statement)
    yield bouncer
    with connection.cursor() as cursor:
        for name in db_role.role_settings():
            cursor.execute(f'ALTER ROLE "{current["role"]}" IN DATABASE "{current["database"]}" RESET {name}')
    bouncer.stop()


def pooled_env(bouncer: PgBouncer, *, direct: bool, **extra: str) -> dict[str, str]:
    """A vpay process's environment with DATABASE_URL at the pooler."""
    env = {"DATABASE_URL": bouncer.url(database_url()), "VPAY_DB_POOLER": "transaction", **extra}
    if direct:
        env["DATABASE_DIRECT_URL"] = database_url()
    return env


def manage(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "VPAY_LOG_FORMAT": "json", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Gunicorn:
    """A real gunicorn serving vpay.wsgi with threads (concurrent requests share the pool)."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        import os

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "gunicorn.log"
        self._log = self.log_path.open("wb")
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self.proc = subprocess.Popen(
            [
                str(gunicorn),
                "vpay.wsgi:application",
                "--bind",
                f"127.0.0.1:{self.port}",
                "--workers",
                "2",
                "--threads",
                "4",
            ],
            cwd=ROOT,
            env={**os.environ, "VPAY_LOG_FORMAT": "json", **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

        def up():
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                urllib.request.urlopen(self.url + "/v1/payment_intents", timeout=2)
            except urllib.error.HTTPError:
                return True  # 401 without a key: Django answered
            except OSError:
                return False
            return True

        wait_for(up, timeout=30, message="gunicorn to answer")

    def call(self, key: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def test_web_and_worker_settle_concurrent_payments_through_pgbouncer(
    pooler, settings, tmp_path, sandbox_rail, start_worker
):
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    policy = worker_env(rails_file, FAST_POLICY)
    _, key = create_merchant("Pooled")
    web = Gunicorn(tmp_path, pooled_env(pooler, direct=False, **policy))
    try:
        worker = start_worker("--concurrency", "4", env=pooled_env(pooler, direct=True, **policy))
        wait_started(worker)

        def pay(i: int) -> str:
            status, intent = web.call(
                key, "POST", "/v1/payment_intents", {"amount": 5000 + i, "currency": "usd", "rail": "sandbox_push"}
            )
            assert status == 200, intent
            status, confirmed = web.call(key, "POST", f"/v1/payment_intents/{intent['id']}/confirm")
            assert status == 200, confirmed
            status, listed = web.call(key, "GET", "/v1/payment_intents?limit=5")
            assert status == 200, listed
            return intent["id"]

        with ThreadPoolExecutor(8) as pool:  # 8 requests at once over 2 x 4 gunicorn threads, 4 server sessions
            intents = list(pool.map(pay, range(24)))

        def settled():
            return scalar(
                "SELECT count(*) FROM charges WHERE intent_id = ANY(%s) AND status = 'succeeded'", [intents]
            ) == len(intents)

        wait_for(settled, timeout=60, message="every charge to settle through the pooler")
        for intent_id in intents:
            status, got = web.call(key, "GET", f"/v1/payment_intents/{intent_id}")
            assert (status, got["status"]) == (200, "succeeded")
        time.sleep(0.5)  # a second run would have written a second event by now
        succeeded = sql(
            "SELECT data->>'id', count(*) FROM events WHERE type = 'payment_intent.succeeded'"
            " AND data->>'id' = ANY(%s) GROUP BY 1",
            [intents],
        )
        assert sorted(succeeded) == sorted((i, 1) for i in intents)
        assert scalar("SELECT count(*) FROM dead_letters") == 0
        started = next(r for r in log_records(worker) if r.get("message") == "worker started")
        assert started["wakeups"] == "direct"
        assert not [r for r in log_records(worker) if r.get("level") in ("error", "critical")]
    finally:
        web.stop()
    web_log = web.log_path.read_text()
    assert "prepared statement" not in web_log and "Traceback" not in web_log, web_log[-3000:]


def test_a_worker_with_only_the_pooled_url_polls_says_so_and_runs_under_the_roles_timeouts(
    pooler, effects, start_worker
):
    from jobs.adapters.postgres import JobRequest, enqueue_many
    from tests.tasks import record_setting

    enqueue_many(
        JobRequest(kind="task", payload={"task": "tests.tasks.record", "args": [f"polled-{i:02d}"], "kwargs": {}})
        for i in range(30)
    )
    record_setting.enqueue("idle", "idle_in_transaction_session_timeout")
    record_setting.enqueue("statement", "statement_timeout")
    worker = start_worker("--concurrency", "3", env=pooled_env(pooler, direct=False))
    wait_started(worker)
    records = log_records(worker)
    said = [r for r in records if r["message"].startswith("no LISTEN/NOTIFY")]
    assert said and said[0]["level"] == "warning" and said[0]["wakeups"] == "poll", records[:5]
    assert next(r for r in records if r["message"] == "worker started")["wakeups"] == "poll"
    assert not any(r.get("alert") for r in records), "the role's timeouts are set: no alert"

    wait_for(lambda: len(effects("polled-")) == 30, timeout=30, message="the backlog to run by polling")
    # Enqueued after start: no NOTIFY reaches this worker, its idle poll finds it.
    from tests.tasks import record

    record.enqueue("late", "")
    wait_for(lambda: effects("late"), timeout=10, message="a job enqueued later to be polled up")
    wait_for(lambda: effects("statement") and effects("idle"), timeout=10, message="the settings recorded")
    assert sorted(label for label, _ in effects("polled-")) == [f"polled-{i:02d}" for i in range(30)]
    # statement_timeout is the role's (30 s); the fenced transaction took its kind's lease
    # for idle-in-transaction with SET LOCAL (the role's 60 s would kill a longer task).
    assert effects("statement") == [("statement", "30s")]
    task_lease = registry.get("task").lease_seconds
    assert effects("idle") == [("idle", f"{int(task_lease)}s")]
    worker.signal()
    assert wait_exit(worker, timeout=30) == 0


def test_a_worker_behind_the_pooler_warns_when_the_role_has_no_timeouts(pooler, start_worker):
    current = db_role.current_timeouts()
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{current["role"]}" IN DATABASE "{current["database"]}" RESET statement_timeout')
    worker = start_worker("--burst", env=pooled_env(pooler, direct=True))
    assert wait_exit(worker, timeout=30) == 0, worker.output()[-3000:]
    alerts = [r for r in log_records(worker) if r.get("alert")]
    assert len(alerts) == 1 and "statement_timeout is 0, not 30000ms" in alerts[0]["message"], alerts
    assert "dbroletimeouts --apply" in alerts[0]["message"]


def test_a_worker_behind_the_pooler_warns_when_the_role_is_not_read_committed(pooler, start_worker):
    current = db_role.current_timeouts()
    role = f'ROLE "{current["role"]}" IN DATABASE "{current["database"]}"'
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER {role} SET default_transaction_isolation = 'repeatable read'")
    try:
        worker = start_worker("--burst", env=pooled_env(pooler, direct=True))
        assert wait_exit(worker, timeout=30) == 0, worker.output()[-3000:]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER {role} SET default_transaction_isolation = 'read committed'")
    alerts = [r for r in log_records(worker) if r.get("alert")]
    assert len(alerts) == 1, alerts
    assert "default_transaction_isolation is repeatable read, not read committed" in alerts[0]["message"]


def test_management_commands_run_through_pgbouncer(pooler):
    env = pooled_env(pooler, direct=False)
    for args in (
        ["migrate", "--no-input"],
        ["createmerchant", "Pooled Commands"],
        ["deadletters", "list", "--state", "all"],
        ["webhooks", "resend", "--since", "1h"],
        ["dbroletimeouts", "--check"],
        ["runworker", "--burst", "--concurrency", "2"],
    ):
        result = manage(*args, env=env)
        assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
    assert scalar("SELECT count(*) FROM merchants WHERE name = 'Pooled Commands'") == 1


def test_without_vpay_db_pooler_pgbouncer_refuses_the_startup_options(pooler):
    result = manage("dbroletimeouts", "--check", env={"DATABASE_URL": pooler.url(database_url())})
    assert result.returncode != 0
    assert "unsupported startup parameter: options" in result.stderr


def test_prepared_statements_cannot_be_turned_on_behind_a_transaction_pooler():
    result = manage(
        "check",
        env={"DATABASE_URL": database_url(), "VPAY_DB_POOLER": "transaction", "VPAY_DB_PREPARED_STATEMENTS": "true"},
    )
    assert result.returncode != 0
    assert "VPAY_DB_PREPARED_STATEMENTS cannot be true with VPAY_DB_POOLER=transaction" in result.stderr
