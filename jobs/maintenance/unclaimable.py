"""Work no worker here can claim: kinds this release has no handler for, due for longer than
``VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS``.

A worker claims only the kinds it has handlers for (``jobs.storage.leases.CLAIM``), so during a
rolling deploy an older worker leaves a newer release's kinds to the newer workers, with no
attempt spent. When no newer worker comes (a deploy stopped half-way, a kind whose workers
were never deployed), those jobs would wait in silence: each worker's maintenance thread
asks once a minute, and raises an alert per kind (at most once per window per process)
with how many wait and for how long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django.conf import settings
from django.db import connection

logger = logging.getLogger("jobs.runner.worker")

PERIOD = 60.0

# Due jobs of kinds outside `kinds`, waiting past the window, per kind. Once a minute per
# worker; a sequential scan of the live jobs (no index leads with kind: the claim's own
# index is by tenant), bounded by the small result.
_UNCLAIMABLE = """
SELECT kind, count(*), extract(epoch FROM now() - min(run_at))::float8
  FROM jobs
 WHERE locked_at IS NULL AND run_at <= now() - make_interval(secs => %(window)s)
   AND queue = ANY(%(queues)s) AND kind <> ALL(%(kinds)s)
 GROUP BY kind
"""


class UnclaimableWatch:
    """One worker's watch; :meth:`check` is a maintenance step."""

    def __init__(self, queues: Sequence[str], kinds: Sequence[str]) -> None:
        self.queues = list(queues)
        self.kinds = list(kinds)
        self._alerted: dict[str, float] = {}  # kind -> monotonic time of its last alert

    def check(self) -> list[tuple[str, int, float]]:
        """Alert for each kind that waits unclaimed past the window; returns what was found."""
        window = float(settings.VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS)
        with connection.cursor() as cursor:
            cursor.execute(_UNCLAIMABLE, {"window": window, "queues": self.queues, "kinds": self.kinds})
            found = [(kind, int(n), float(age)) for kind, n, age in cursor.fetchall()]
        now = time.monotonic()
        for kind, waiting, age in found:
            last = self._alerted.get(kind)
            if last is not None and now - last < max(window, PERIOD):
                continue
            self._alerted[kind] = now
            logger.error(
                "jobs of a kind this worker has no handler for have waited past the window; "
                "is a worker of the release that knows it running?",
                extra={"kind": kind, "waiting": waiting, "oldest_seconds": round(age), "alert": True},
            )
        return found
