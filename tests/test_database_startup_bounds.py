"""Startup against a database that does not answer: bounded by the statement timeout and
the connect timeout, with a clear message (``docs/rehearsals.md``).

* **Blocked startup.** ``runworker``'s first query (the migration check reads
  ``django_migrations``) waits on a lock another session holds; the statement timeout
  (``VPAY_DB_STATEMENT_TIMEOUT_MS``) cancels it and the process exits non-zero, saying so.
* **Accepted TCP, no handshake.** A listener that accepts connections and never sends a
  byte (a hung server, a black-holing proxy): ``VPAY_DB_CONNECT_TIMEOUT`` bounds
  ``runworker`` and ``migrate`` (each exits non-zero with a message naming the timeout), and
  the web process answers ``503 database_unavailable`` within it rather than hang a request.

Each bound is measured from the moment the process is seen waiting (its query waiting on
the lock in ``pg_stat_activity``, its connection accepted by the listener), so the
interpreter's own start-up time is not counted against it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from tests.conftest import ROOT, database_url, wait_for
from tests.outage_support import WebProcess

STATEMENT_TIMEOUT_MS = 1500
CONNECT_TIMEOUT = 2
MARGIN = 2.0  # the process's own teardown after the timeout fired


class SilentListener:
    """Accepts TCP connections on 127.0.0.1 and never answers; records when each arrived."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[float] = []
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            self._held.append(conn)  # kept open, never read, never written

    def url(self) -> str:
        return f"postgresql://vpay@127.0.0.1:{self.port}/vpay"

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_listener():
    listener = SilentListener()
    yield listener
    listener.close()


def run_until_exit(args: list[str], env: dict[str, str], started_waiting, timeout: float = 20):
    """Run ``manage.py ARGS``; returns (exit code, output, seconds from ``started_waiting()``
    first being true to the exit)."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "VPAY_LOG_FORMAT": "json", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def waiting() -> float | None:
            since = started_waiting()
            if since is None and proc.poll() is not None:
                pytest.fail(f"{args[0]} exited before it was seen waiting on the database: {proc.stdout.read()}")
            return since

        waiting_since = wait_for(
            waiting,
            timeout=30,
            interval=0.02,
            message=f"{args[0]} to wait on the database",
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{args[0]} still running after {timeout}s: unbounded")
        return proc.returncode, output, time.monotonic() - waiting_since
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- blocked startup ---------------------------------------------------------------------------


@pytest.mark.django_db  # the test database's URL; the lock is taken on a connection of its own
def test_runworker_whose_startup_query_waits_on_a_lock_exits_at_the_statement_timeout_saying_so():
    url = database_url()
    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as observer:
        # An open transaction holding what runworker reads first (a migration running
        # elsewhere takes such locks).
        holder.execute("LOCK TABLE django_migrations IN ACCESS EXCLUSIVE MODE")

        def worker_waits_on_the_lock() -> float | None:
            waiting = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'vpay-worker:startup-blocked%' AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            return time.monotonic() if waiting else None

        code, output, seconds = run_until_exit(
            ["runworker", "--worker-id", "startup-blocked"],
            {"DATABASE_URL": url, "VPAY_DB_STATEMENT_TIMEOUT_MS": str(STATEMENT_TIMEOUT_MS)},
            worker_waits_on_the_lock,
        )
        holder.rollback()
    assert code != 0, output
    assert seconds < STATEMENT_TIMEOUT_MS / 1000 + MARGIN, (seconds, output)
    assert "VPAY_DB_STATEMENT_TIMEOUT_MS" in output and "statement timeout" in output, output
    assert "Traceback" not in output, output


# --- accepted TCP, no handshake ----------------------------------------------------------------


@pytest.mark.parametrize("command", [["runworker"], ["migrate", "--no-input"]], ids=["runworker", "migrate"])
def test_a_command_against_a_server_that_never_answers_exits_at_the_connect_timeout_saying_so(silent_listener, command):
    code, output, seconds = run_until_exit(
        command,
        {"DATABASE_URL": silent_listener.url(), "VPAY_DB_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)},
        lambda: silent_listener.accepted[0] if silent_listener.accepted else None,
    )
    assert code != 0, output
    assert seconds < CONNECT_TIMEOUT + MARGIN, (seconds, output)
    assert "VPAY_DB_CONNECT_TIMEOUT" in output, output
    assert "Traceback" not in output, output


def test_the_web_process_against_a_server_that_never_answers_starts_and_answers_503_within_the_connect_timeout(
    silent_listener, tmp_path
):
    web = WebProcess(
        silent_listener.url(), tmp_path / "gunicorn.log", env={"VPAY_DB_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)}
    )
    try:
        web.wait_serving()  # its start-up reads nothing from the database
        answer = web.get("/v1/payment_intents", "sk_test_" + "a" * 43)
        assert silent_listener.accepted, "the request never tried the database"
        assert answer.status == 503 and answer.body["error"]["code"] == "database_unavailable", answer
        assert answer.seconds < CONNECT_TIMEOUT + MARGIN, answer
    finally:
        web.stop()
