"""The listener thread: ``LISTEN vpay_jobs`` on a connection of its own, waking the
dispatcher when work for one of the worker's queues becomes due.

Enqueue notifies at commit (a due job only); so do a reschedule to now and a rescued
lease. Without the listener the dispatcher still finds work at its idle poll, so a failed
connection only costs latency: it is logged and retried with a backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import psycopg
from django.db import connection

from jobs.repository import NOTIFY_CHANNEL
from vpay.errors import error_chain

logger = logging.getLogger("jobs.worker")

BACKOFF_CAP = 10.0


def listen(
    *,
    worker_id: str,
    queues: Sequence[str],
    wake: Callable[[], None],
    stopping: threading.Event,
    poll: float,
) -> None:
    """Run until ``stopping`` is set; ``wake()`` on every relevant notification."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    params["application_name"] = f"vpay-listen:{worker_id}"[:63]
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
