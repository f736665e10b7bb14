"""The listener thread: ``LISTEN vpay_jobs`` on a connection of its own, waking the
dispatcher when work for one of the worker's queues becomes due.

Enqueue notifies at commit (a due job only); so do a reschedule to now and a rescued
lease. Without the listener the dispatcher still finds work at its idle poll, so a failed
connection only costs latency: it is logged and retried with a backoff.

``LISTEN`` belongs to a session, which a transaction pooler does not give: the connection
goes to ``DATABASE_DIRECT_URL`` when it is set, to ``DATABASE_URL`` when that is the server
itself, and nowhere behind a pooler without a direct URL (``vpay.db_pooler.wake_source``;
the worker then only polls, and says so at startup).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import psycopg
from django.conf import settings
from django.db import connection

from jobs.storage.repository import NOTIFY_CHANNEL
from vpay.db_pooler import WakeSource, startup_options
from vpay.errors import error_chain

logger = logging.getLogger("jobs.runner.worker")

BACKOFF_CAP = 10.0


def connect_params(source: WakeSource, worker_id: str) -> dict:
    """psycopg's connection arguments for the ``LISTEN`` session (``source`` is never POLL)."""
    if source is WakeSource.DIRECT:
        direct = settings.VPAY_DATABASE_DIRECT
        params = {
            **direct.get("OPTIONS", {}),  # the URL's query: sslmode and the like
            "dbname": direct["NAME"],
            "user": direct.get("USER") or None,
            "password": direct.get("PASSWORD") or None,
            "host": direct.get("HOST") or None,
            "port": direct.get("PORT") or None,
            "connect_timeout": settings.DB_CONNECT_TIMEOUT,
            # The server itself accepts startup options, whatever the pooled URL is.
            **startup_options(
                pooler="none",
                statement_timeout_ms=settings.DB_STATEMENT_TIMEOUT_MS,
                idle_in_tx_timeout_ms=settings.DB_IDLE_IN_TX_TIMEOUT_MS,
            ),
        }
        params = {k: v for k, v in params.items() if v is not None}
    else:
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold"):
            params.pop(key, None)
    params["application_name"] = f"vpay-listen:{worker_id}"[:63]
    return params


def listen(
    *,
    params: dict,
    queues: Sequence[str],
    wake: Callable[[], None],
    stopping: threading.Event,
    poll: float,
) -> None:
    """Run until ``stopping`` is set; ``wake()`` on every relevant notification."""
    wanted = set(queues)
    failures = 0
    while not stopping.is_set():
        try:
            with psycopg.connect(**params, autocommit=True) as conn:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                failures = 0
                wake()  # a catch-up wake: anything enqueued while we were not listening
                while not stopping.is_set():
                    for notify in conn.notifies(timeout=poll):
                        if notify.payload in wanted or not notify.payload:
                            wake()
        except Exception as exc:  # noqa: BLE001 - idle polling covers for the listener; keep trying
            failures += 1
            logger.warning("LISTEN connection failed; idle polling continues", extra={"error": error_chain(exc, 300)})
            stopping.wait(min(poll * 2**failures, BACKOFF_CAP))
    connection.close()
