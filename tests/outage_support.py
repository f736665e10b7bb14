"""What the outage rehearsals share: a backlog enqueued on the owned cluster, a real
``gunicorn`` serving it, and reading the rows and log lines they are judged by."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.owned_postgres import ROOT, free_port, manage


def enqueue_backlog(database_url: str, prefix: str, count: int, seconds: float) -> None:
    """``count`` ``record_slowly`` tasks (``prefix-00000`` …, ``seconds`` each), enqueued
    through the queue's own code in a ``manage.py shell`` against ``database_url``."""
    code = (
        "from jobs.adapters.postgres import JobRequest, enqueue_many\n"
        "enqueue_many(JobRequest(kind='task', payload={'task': 'tests.tasks.record_slowly',"
        f" 'args': [f'{prefix}-{{i:05d}}', {seconds!r}], 'kwargs': {{}}}}) for i in range({count}))\n"
    )
    manage(database_url, "shell", "-c", code)


def create_merchant_key(database_url: str) -> str:
    return manage(database_url, "createmerchant", "Outage rehearsal").strip().splitlines()[-1]


def query(database_url: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def scalar(database_url: str, sql: str, params=None):
    return query(database_url, sql, params)[0][0]


def held_leases(database_url: str, worker_id: str) -> set[tuple[int, str]]:
    """(job id, lease token) of every job the worker holds now."""
    rows = query(database_url, "SELECT id, lease_token::text FROM jobs WHERE locked_by = %s", [worker_id])
    return {(job_id, token) for job_id, token in rows}


def still_held(database_url: str, leases: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """Those of ``leases`` that are still held under the same token (not handed back,
    finished or reaped)."""
    if not leases:
        return set()
    rows = query(
        database_url,
        "SELECT id, lease_token::text FROM jobs WHERE id = ANY(%s) AND lease_token IS NOT NULL",
        [[job_id for job_id, _ in leases]],
    )
    return leases & {(job_id, token) for job_id, token in rows}


def effect_labels(database_url: str, prefix: str) -> dict[str, int]:
    rows = query(
        database_url, "SELECT label, count(*) FROM test_effects WHERE label LIKE %s GROUP BY label", [prefix + "%"]
    )
    return dict(rows)


def log_records(path: Path) -> list[dict]:
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def messages(path: Path) -> list[str]:
    return [r.get("message", "") for r in log_records(path)]


# --- the web process -------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: dict
    headers: dict[str, str]
    seconds: float


class WebProcess:
    """A real ``gunicorn vpay.wsgi`` (one worker) against ``database_url``."""

    def __init__(self, database_url: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = log_path
        self._log = log_path.open("wb")
        gunicorn = Path(sys.executable).with_name("gunicorn")
        self.proc = subprocess.Popen(
            [str(gunicorn), "vpay.wsgi:application", "--bind", f"127.0.0.1:{self.port}", "--workers", "1",
             "--timeout", "60"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url, "VPAY_LOG_FORMAT": "json", **(env or {})},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_serving(self, timeout: float = 30) -> None:
        """Until it answers HTTP at all (an unknown /v1 path needs no database)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.get("/v1/no-such-route", "")
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"gunicorn did not serve:\n{self.output()[-3000:]}") from None
                time.sleep(0.1)

    def get(self, path: str, key: str, timeout: float = 30) -> Answer:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Bearer {key}"} if key else {}
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, body, headers = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            status, body, headers = exc.code, exc.read(), dict(exc.headers)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {"unparsed": body.decode(errors="replace")[:500]}
        return Answer(status, parsed, headers, time.monotonic() - started)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
