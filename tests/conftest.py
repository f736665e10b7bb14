"""Shared fixtures: the real database, the effects table, and real worker subprocesses."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

# Fixtures shared across test files, one module per area (in place of copies per file).
pytest_plugins = [
    "tests.payment_fixtures",
    "tests.webhook_fixtures",
    "tests.job_fixtures",
    "tests.browser_fixtures",
]


def pytest_configure(config):
    # Settings start nothing: without DATABASE_URL the tests, like manage.py, start the
    # embedded development database themselves before pytest-django creates test_vpay.
    from vpay.embedded_db import ensure_running_if_used

    ensure_running_if_used()


def pytest_collection_modifyitems(config, items):
    # Under xdist (`make test`), each worker would build its own owned cluster (initdb and
    # migrations, tests/owned_postgres.py) for the tests that use one: they all go to one
    # worker instead (`--dist loadgroup`), which builds it once.
    for item in items:
        if "owned_postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("owned_postgres"))
    # The slow tests first: xdist hands tests out in this order, so a run's last minute is
    # short tests filling the gaps, not one worker finishing a 15 s rehearsal alone.
    items.sort(key=lambda item: not _slow(item))


# Fixtures that start real processes (workers, rails, receivers, clusters): seconds a test.
_PROCESS_FIXTURES = {"start_worker", "owned_postgres", "sandbox_rail", "receiver", "payment_stack", "bench_env"}


def _slow(item) -> bool:
    return item.get_closest_marker("slow") is not None or not _PROCESS_FIXTURES.isdisjoint(
        getattr(item, "fixturenames", ())
    )


def pytest_collection_finish(session):
    # Django, the test modules and the collected items live for the whole run: frozen, no
    # full collection traverses them again (vpay/startup_heap.py says why; the collector
    # was a tenth of an xdist worker's CPU).
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _flush_only_what_was_written(django_db_setup, django_db_blocker):
    # Transactional tests end by emptying the tables they wrote, not every table (tests/db_flush.py).
    from tests import db_flush

    with django_db_blocker.unblock():
        db_flush.install()


def database_url() -> str:
    """A URL for the database the tests are using (the test database), for subprocesses."""
    s = connection.settings_dict
    host = s["HOST"] or s["OPTIONS"].get("host", "")
    auth = quote(s["USER"] or "", safe="")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"], safe="")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{s['NAME']}?host={quote(host, safe='/')}"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgresql://{auth}@{host}{port}/{s['NAME']}"


@pytest.fixture
def effects(django_db_blocker):
    """The ``test_effects`` table, emptied; returns a function reading its rows."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS test_effects ("
            " id bigserial PRIMARY KEY, label text NOT NULL, value text NOT NULL DEFAULT '',"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        cursor.execute("TRUNCATE test_effects")

    def rows(label_prefix: str = "") -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT label, value FROM test_effects WHERE label LIKE %s ORDER BY id", [label_prefix + "%"]
            )
            return cursor.fetchall()

    return rows


class WorkerProcess:
    """A real ``python manage.py runworker`` subprocess against the test database."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, log_path: Path | None = None) -> None:
        full_env = {
            **os.environ,
            # One process, the worker itself, unless a test asks for more or for the default
            # (VPAY_WORKER_PROCESSES="": a process per core, as the rehearsals run): most
            # tests name, signal and count one worker.
            "VPAY_WORKER_PROCESSES": "1",
            "DATABASE_URL": database_url(),
            "VPAY_LOG_FORMAT": "json",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", *args],
            cwd=ROOT,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self._log is not subprocess.DEVNULL:
                self._log.close()

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path else ""

    def wait_started(self, timeout: float = 60) -> WorkerProcess:
        """Wait for its ``worker started`` line (booted: reaped, seeded, executors claiming),
        so a test's timing starts from a running worker, not from a process importing Django
        on a loaded machine."""
        wait_for(
            lambda: '"worker started"' in self.output() or self.proc.poll() is not None,
            timeout,
            0.05,
            "the worker's started line",
        )
        assert self.proc.poll() is None, self.output()[-2000:]
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            # A supervisor's children (runworker --processes) would drain for their grace
            # after it: they go with it. Stopped first, so it forks no replacement meanwhile.
            self.proc.send_signal(signal.SIGSTOP)
            children = psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.kill()
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def start_worker(tmp_path):
    """Start real worker subprocesses; all are killed at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(*args, env=env, log_path=tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until truthy; fail the test with ``message`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {message}")


@pytest.fixture
def receiver():
    """A real sandbox webhook receiver process (``python -m sandbox.receiver``); killed at teardown."""
    from tests.webhook_support import start_receiver

    r = start_receiver()
    yield r
    r.stop()


@pytest.fixture
def acme():
    """A merchant and its API client (tests.api_support); a module may define its own."""
    from tests.api_support import MerchantClient

    return MerchantClient("Acme")


@pytest.fixture
def globex():
    """A second merchant, for what one merchant must not see of another's."""
    from tests.api_support import MerchantClient

    return MerchantClient("Globex")


# The sandbox rail (a real HTTP subprocess, one per session) for the charges tests.
from tests.rail_support import sandbox_rail  # noqa: E402, F401


@pytest.fixture
def rails(settings, tmp_path, sandbox_rail):  # noqa: F811
    """The sandbox rail configured for this test, with the fast recovery policy (and a confirm
    grace long enough that no poll races the test's own confirm)."""
    from tests.charges_support import FAST_POLICY, apply_policy, use_rails

    apply_policy(settings, {**FAST_POLICY, "VPAY_CHARGE_CONFIRM_GRACE_SECONDS": 30.0})
    use_rails(settings, tmp_path, sandbox_rail.rails())
    return sandbox_rail


@pytest.fixture(scope="session")
def owned_postgres():
    """A PostgreSQL cluster of the suite's own (tests/owned_postgres.py), started, with a
    migrated template database; skipped, saying why, where one cannot be made. A test that
    stops it must start it again (``owned_database`` checks)."""
    from tests.owned_postgres import OwnedPostgres, missing_reason

    reason = missing_reason()
    if reason:
        pytest.skip(f"no owned PostgreSQL: {reason}")
    cluster = OwnedPostgres()
    try:
        cluster.init()
        cluster.start()
        cluster.migrate_template()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def owned_database(owned_postgres, request):
    """A fresh migrated database on the owned cluster, for one test: its URL. The cluster is
    running again when the test ends, whatever the test did to it."""
    name = "rehearsal_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    yield owned_postgres.fresh_database(name)
    if not owned_postgres.running():
        owned_postgres.start()
