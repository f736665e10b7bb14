"""A PostgreSQL cluster the suite owns: its own ``initdb`` on a free port, which a test may
restart, stop and start under running processes (the outage rehearsals,
``tests/test_database_outage.py``).

The shared test database cannot be stopped (every other test and helper uses its server),
so the rehearsals run their processes against this one: Debian's PostgreSQL binaries
(``/usr/lib/postgresql/<version>/bin``, or whatever ``pg_config --bindir`` or ``PATH``
offers), run as the ``postgres`` OS user when the suite runs as root (PostgreSQL refuses
root), listening on 127.0.0.1 only with trust authentication. Its data lives in a fresh
temporary directory deleted at the end of the session.

One database is migrated once (``manage.py migrate``) and kept as a template; each test
takes a fresh copy of it (:meth:`OwnedPostgres.fresh_database`), so no test sees another's
rows and none pays for the migrations again.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "vpay_migrated"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None when PostgreSQL's server
    binaries are not installed (Debian keeps them out of PATH)."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if candidates:
        return candidates[-1].parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def missing_reason() -> str | None:
    """Why an owned cluster cannot be made here, or None."""
    if find_bindir() is None:
        return "PostgreSQL's server binaries (initdb, pg_ctl) are not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` OS user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root without `runuser` to run initdb as the postgres user"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OwnedPostgres:
    """One cluster: ``init`` once, then ``start``/``stop``/``restart`` at will."""

    def __init__(self) -> None:
        bindir = find_bindir()
        assert bindir is not None, missing_reason()
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="vpay-owned-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)

    # --- the server ----------------------------------------------------------------------

    def _run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{self.tail()}")
        return result

    def init(self) -> None:
        # --no-sync: a throwaway cluster needs no durable initdb; the server keeps fsync on.
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def _server_options(self) -> str:
        return (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c max_connections=100 -c log_min_messages=warning"
        )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._server_options(), "-w", "start")

    def stop(self) -> None:
        """A fast shutdown: sessions are terminated, open transactions roll back."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session terminated, the server back at once."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", self._server_options(), "-m", "fast", "-w",
            "restart",
        )  # fmt: skip

    def running(self) -> bool:
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "status"]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    # --- databases -----------------------------------------------------------------------

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5)

    def migrate_template(self) -> None:
        """Create and migrate the template database every test copies."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        manage(self.url(TEMPLATE), "migrate", "--no-input", "-v", "0")
        with self.connect(TEMPLATE) as conn:
            # The effects table of tests/tasks.py (the conftest's ``effects`` fixture makes it
            # in the shared test database).
            conn.execute(
                "CREATE TABLE test_effects ("
                " id bigserial PRIMARY KEY, label text NOT NULL, value text NOT NULL DEFAULT '',"
                " at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def fresh_database(self, name: str) -> str:
        """A copy of the migrated template under ``name`` (dropped first if it exists); its URL."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        return self.url(name)


def manage(database_url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """``python manage.py ARGS`` against ``database_url``; its stdout (fails loudly)."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout
