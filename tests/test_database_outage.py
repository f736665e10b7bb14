"""The database goes away under running processes: a fast restart and a 10 s stop of a
PostgreSQL the suite owns (``owned_postgres``: its own ``initdb`` on a free port), under a
real ``runworker`` with a backlog and a real ``gunicorn``. ``docs/rehearsals.md`` says what
each injects, checks and found.

The fast cases run in ``make test``; the long outage with a larger backlog is marked
``rehearse`` (``make rehearse``).

The worker runs at the default heartbeat (5 s, a 12 s lease): an outage is not a crash
(docs/runner.md, "Liveness"), so a held job that is claimable again soon after the database
is back was handed back by its worker, never rescued by a reaper (the log says which, too).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest

from tests.conftest import wait_for
from tests.outage_support import (
    WebProcess,
    create_merchant_key,
    effect_labels,
    enqueue_backlog,
    held_leases,
    messages,
    query,
    scalar,
    still_held,
)

pytestmark = pytest.mark.timeout(240)

HANDED_BACK = "handed back leases whose settle failed"
REAPED = "rescued the jobs of a dead worker"
# How soon after the database is back the held jobs must be claimable again: far inside
# the lease (a rescue would come only after it expired).
HAND_BACK_WITHIN = 5.0


def start_outage_worker(start_worker, url: str, worker_id: str):
    worker = start_worker(
        "--concurrency", "4", "--worker-id", worker_id, "--grace", "10",
        env={"DATABASE_URL": url},
    )  # fmt: skip

    def started() -> bool:
        assert worker.proc.poll() is None, "the worker exited at start:\n" + worker.output()[-3000:]
        return "worker started" in messages(worker.log_path)

    wait_for(started, timeout=30, message="the worker to start")
    return worker


def busy(url: str, worker, worker_id: str, prefix: str, at_least: int) -> set[tuple[int, str]]:
    """Once ``at_least`` effects are in and all four executors hold a job: what it holds."""

    def ready():
        assert worker.proc.poll() is None, worker.output()[-3000:]
        if sum(effect_labels(url, prefix).values()) < at_least:
            return None
        held = held_leases(url, worker_id)
        return held if len(held) == 4 else None

    return wait_for(ready, timeout=60, interval=0.02, message=f"{at_least} effects with 4 jobs held")


def handed_back_within(url: str, held: set[tuple[int, str]], seconds: float) -> float:
    """Seconds until none of ``held`` is held under its old token any more (fails past ``seconds``)."""
    back = time.monotonic()
    wait_for(
        lambda: not still_held(url, held), timeout=seconds, interval=0.05, message="the held jobs to be handed back"
    )
    return time.monotonic() - back


def assert_finished_exactly_once(url: str, worker, prefix: str, total: int) -> None:
    wait_for(
        lambda: scalar(url, "SELECT count(*) FROM jobs WHERE kind = 'task'") == 0,
        timeout=120,
        message="the backlog to drain",
    )
    labels = effect_labels(url, prefix)
    assert len(labels) == total, f"{total - len(labels)} jobs have no effect"
    assert {label: n for label, n in labels.items() if n > 1} == {}, "duplicate effects"
    assert query(url, "SELECT kind, cause, last_error FROM dead_letters") == []
    assert worker.proc.poll() is None, "the worker exited: " + worker.output()[-3000:]


def stop_cleanly(worker) -> None:
    worker.signal(signal.SIGTERM)
    try:
        assert worker.wait(timeout=30) == 0, worker.output()[-3000:]
    except subprocess.TimeoutExpired:
        pytest.fail("the worker did not drain after SIGTERM:\n" + worker.output()[-3000:])


# --- fast cases (make test) --------------------------------------------------------------------


def test_a_fast_restart_under_a_busy_worker_is_handed_back_at_once_and_finished_exactly_once(
    owned_postgres, owned_database, start_worker
):
    url, total = owned_database, 40
    enqueue_backlog(url, "restart", total, 0.25)
    worker = start_outage_worker(start_worker, url, "outage-restart")
    held = busy(url, worker, "outage-restart", "restart-", 4)

    owned_postgres.restart()
    took = handed_back_within(url, held, HAND_BACK_WITHIN)

    assert_finished_exactly_once(url, worker, "restart-", total)
    log = messages(worker.log_path)
    assert HANDED_BACK in log and REAPED not in log, (took, log[-30:])
    stop_cleanly(worker)


def test_the_web_process_answers_503_while_the_database_is_down_and_recovers(owned_postgres, owned_database, tmp_path):
    url = owned_database
    key = create_merchant_key(url)
    web = WebProcess(url, tmp_path / "gunicorn.log", env={"VPAY_DB_CONNECT_TIMEOUT": "2"})
    try:
        web.wait_serving()
        assert web.get("/v1/payment_intents", key).status == 200
        owned_postgres.stop()
        try:
            down = web.get("/v1/payment_intents", key)
        finally:
            owned_postgres.start()
        assert down.status == 503, (down, web.output()[-3000:])
        assert down.body["error"]["code"] == "database_unavailable"
        assert set(down.body["error"]) == {"type", "code", "message", "param", "request_id"}
        assert down.body["error"]["request_id"] == down.headers["Request-Id"]
        assert int(down.headers["Retry-After"]) >= 1
        assert down.seconds < 3
        up = web.get("/v1/payment_intents", key)
        assert up.status == 200, up
    finally:
        web.stop()


# --- the full rehearsal (make rehearse) --------------------------------------------------------


@pytest.mark.rehearse
def test_a_restart_then_a_10s_outage_under_a_worker_with_a_backlog_and_the_web_process(
    owned_postgres, owned_database, start_worker, tmp_path
):
    url, total = owned_database, 800
    key = create_merchant_key(url)
    enqueue_backlog(url, "outage", total, 0.05)
    web = WebProcess(url, tmp_path / "gunicorn.log", env={"VPAY_DB_CONNECT_TIMEOUT": "2"})
    worker = start_outage_worker(start_worker, url, "outage-long")
    pid = worker.proc.pid
    try:
        web.wait_serving()
        # 1. A fast restart.
        held = busy(url, worker, "outage-long", "outage-", 100)
        owned_postgres.restart()
        restart_hand_back = handed_back_within(url, held, HAND_BACK_WITHIN)

        # 2. Later, 10 s without a database. The web process answers 503 throughout.
        held = busy(url, worker, "outage-long", "outage-", 300)
        done_before = sum(effect_labels(url, "outage-").values())  # nothing commits while it is down
        owned_postgres.stop()
        down_answers = []
        stopped = time.monotonic()
        while time.monotonic() - stopped < 10:
            down_answers.append(web.get("/v1/payment_intents", key))
            time.sleep(0.5)
        assert worker.proc.poll() is None, worker.output()[-3000:]
        owned_postgres.start()
        back = time.monotonic()
        outage_hand_back = handed_back_within(url, held, HAND_BACK_WITHIN)
        wait_for(
            lambda: sum(effect_labels(url, "outage-").values()) > done_before,
            timeout=HAND_BACK_WITHIN * 3,
            message="the worker to resume work",
        )
        resumed = time.monotonic() - back
        up = wait_for(
            lambda: (a := web.get("/v1/payment_intents", key)).status == 200 and a,
            timeout=10,
            message="the web process to recover",
        )

        assert_finished_exactly_once(url, worker, "outage-", total)
        assert worker.proc.pid == pid
        assert len(down_answers) >= 10
        assert {(a.status, a.body["error"]["code"]) for a in down_answers} == {(503, "database_unavailable")}
        assert max(a.seconds for a in down_answers) < 3
        assert up.body["object"] == "list"
        log = messages(worker.log_path)
        assert log.count(HANDED_BACK) >= 2 and REAPED not in log, log[-40:]
        print(
            f"\nhand-back after the restart: {restart_hand_back:.2f}s; after the 10 s outage: hand-back"
            f" {outage_hand_back:.2f}s, first effect {resumed:.2f}s; 503s: {len(down_answers)},"
            f" slowest {max(a.seconds for a in down_answers):.3f}s; worker log: {dict(Counter(log))}"
        )
        stop_cleanly(worker)
    finally:
        web.stop()
