"""How each ``sweep_expired`` step has been doing: a run of failed passes alerts once.

A step that fails is logged at WARN and the sweep goes on (``jobs.maintenance.housekeeping``). Failing
*every* pass is different: an expiry that never runs is a table that grows and a promise
(24 h idempotency, 24 h checkout sessions) that is quietly broken. So each failed pass is
counted in ``sweep_step_streaks`` — in the database, because the hourly passes outlive any
one worker — and the pass that reaches :data:`SWEEP_STEP_ALERT_AFTER` raises one alert. The
step's next good pass deletes the row, which re-arms it: the next streak, with its own
start, is a new alert key.

A failed pass is one where the step raised, or skipped rows it could not retire (a row
that fails every hour is the same silence, one row at a time).
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection, transaction

from jobs.models import LAST_ERROR_MAX
from jobs.operator.alerts import Severity, raise_alert
from vpay.errors import error_chain

logger = logging.getLogger("jobs.maintenance.housekeeping")

# Consecutive failed passes before the alert: three hours at the hourly cadence, so one bad
# deploy or one lock wait does not page anyone, and a step that is really broken does.
SWEEP_STEP_ALERT_AFTER = 3


def step_failed(step: str, error: str) -> None:
    """Count a failed pass of ``step``; alert once, at the bound. Never raises for the
    database: failing to count must not stop the sweep (it is logged)."""
    error = error.replace("\x00", "\ufffd")[:LAST_ERROR_MAX]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # Upsert on the primary key: the first failure opens the streak at the
            # database's now(), each later one counts on.
            cursor.execute(
                "INSERT INTO sweep_step_streaks (step, failures, since, last_error) VALUES (%s, 1, now(), %s)"
                " ON CONFLICT (step) DO UPDATE SET failures = sweep_step_streaks.failures + 1,"
                " last_error = EXCLUDED.last_error"
                " RETURNING failures, floor(EXTRACT(EPOCH FROM since) * 1000000)::bigint, since",
                [step, error],
            )
            failures, since_us, since = cursor.fetchone()
            # Raised in the counting transaction: an alert that fails to commit un-counts
            # the pass, and the next one reaches the bound again.
            if failures == SWEEP_STEP_ALERT_AFTER:
                raise_alert(
                    key=f"sweep_step_failing:{step}:{since_us}",  # the streak names the alert
                    title=f"Housekeeping step {step!r} failed on {failures} consecutive sweeps",
                    source="jobs.sweep_step_failing",
                    severity=Severity.ERROR,
                    details={
                        "step": step,
                        "consecutive_failures": failures,
                        "since": since.isoformat(),
                        "error": error[:300],
                    },
                )
    except DatabaseError as exc:
        logger.warning("could not count a failed sweep step", extra={"step": step, "error": error_chain(exc, 300)})
        return
    if failures == SWEEP_STEP_ALERT_AFTER:
        logger.error(
            "sweep step keeps failing (alert raised)",
            extra={"step": step, "consecutive_failures": failures, "error": error[:300]},
        )


def step_succeeded(step: str) -> None:
    """End ``step``'s streak, if it had one (re-arms its alert). Never raises for the database."""
    try:
        with connection.cursor() as cursor:
            # By primary key; a step with no streak matches nothing.
            cursor.execute("DELETE FROM sweep_step_streaks WHERE step = %s", [step])
            ended = cursor.rowcount
    except DatabaseError as exc:
        logger.warning(
            "could not clear a sweep step's failure streak", extra={"step": step, "error": error_chain(exc, 300)}
        )
        return
    if ended:
        logger.info("sweep step healthy again", extra={"step": step})
