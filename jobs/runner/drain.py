"""The drain: what a worker does between a stop and its exit. Its executors stop claiming
and finish within the grace (the beat keeps their leases), the completer flushes, and every
lease still held is handed back, guarded on its token (docs/runner.md, "Drain")."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from django.db import connection

from jobs.maintenance import liveness
from jobs.runner.settling import DB_ERRORS
from jobs.storage import leases
from vpay.errors import error_chain

if TYPE_CHECKING:
    from jobs.runner.worker import Worker

logger = logging.getLogger("jobs.runner.worker")

# How long a drain waits for the completer to acknowledge what it holds before doing it itself.
COMPLETER_DRAIN_SECONDS = 5.0


def wait_and_drain(w: Worker) -> bool:
    """Wait for the executors to stop claiming and finish, and the completer to flush;
    at grace expiry (or a second signal) hand back what still runs."""
    executors = [t for t in w._threads if t.name.startswith("vpay-exec")]
    while not w._stopping.is_set() and not w._exit_now.is_set():
        w._stopping.wait(0.05)
    w._wake()
    abandoned = False
    while any(t.is_alive() for t in executors):
        if w._exit_now.is_set():
            abandoned = True
            logger.warning("second signal: exiting now; held leases are left to the reaper")
            break
        if w._grace_deadline is not None and time.monotonic() >= w._grace_deadline:
            abandoned = True
            break
        time.sleep(0.02)
    w._completer.close()
    if not w._completer.drain(timeout=COMPLETER_DRAIN_SECONDS):
        # The completer is gone or stuck: acknowledge what it holds here, or a clean exit
        # would leave finished jobs leased by a worker whose row is about to go, for the
        # reaper to rescue as if it had crashed (attempts spent, the last a dead letter).
        w.settler.finish(*w._completer.take_unflushed())
        release_pending_settles(w)
    if abandoned and not w._exit_now.is_set():
        release_everything_held(w)
    else:
        release_unstarted(w)
    w._beat_stop.set()
    if not abandoned:
        try:
            liveness.worker_deregister(w.worker_id)
        except DB_ERRORS:
            pass
        finally:
            connection.close()
    return abandoned


def release_pending_settles(w: Worker) -> None:
    """Hand back the leases whose settle write failed, once more before exiting."""
    try:
        w.settler.hand_back_pending()
    finally:
        connection.close()


def release_unstarted(w: Worker) -> None:
    """Jobs claimed but never handed to an executor (a stop raced the claim): back, attempt refunded."""
    w.dispatcher.unstarted()
    with w._cv:
        unstarted = [r.job for r in w._running.values() if r.ctx is None]
    _release(w, [(j.id, j.lease_token) for j in unstarted], refund=True, error="")


def release_everything_held(w: Worker) -> None:
    """Grace ran out: hand back every lease this process still holds (guarded).

    Finished jobs whose delete was still buffered are deleted; every other job goes back
    due now with its attempt refunded, started or not: a shutdown is not the job's
    failure, and counting it would spend an attempt of every job longer than ``--grace``
    at every deploy (its last one a dead letter). Except a handler already past its
    kind's timeout: that attempt failed on its own, and is spent.
    """
    w.settler.finish(*w._completer.take_unflushed())
    w.dispatcher.unstarted()
    with w._cv:
        held = list(w._running.values())
    started = [(r.job.id, r.job.lease_token) for r in held if r.ctx is not None and r.ctx.remaining() >= 0]
    overdue = [(r.job.id, r.job.lease_token) for r in held if r.ctx is not None and r.ctx.remaining() < 0]
    unstarted = [(r.job.id, r.job.lease_token) for r in held if r.ctx is None]
    _release(w, unstarted, refund=True, error="")
    _release(
        w,
        started,
        refund=True,
        error=f"released at shutdown: grace elapsed (worker {w.worker_id}); attempt refunded",
    )
    # Past its own timeout, it failed whatever the deploy: refunding it would let a hung
    # handler come back for free at every deploy and never reach a dead letter.
    _release(
        w,
        overdue,
        refund=False,
        error=f"released at shutdown past its timeout (worker {w.worker_id}); attempt spent",
    )
    logger.warning(
        "grace elapsed; released held leases",
        extra={"worker_id": w.worker_id, "in_flight": len(started), "unstarted": len(unstarted)},
    )


def _release(w: Worker, held: list, *, refund: bool, error: str) -> None:
    if not held:
        return
    try:
        w._report.add("released", leases.release(held, refund=refund, error=error))
    except DB_ERRORS as exc:
        logger.error("releasing held leases failed; the reaper will free them", extra={"error": error_chain(exc, 500)})
    finally:
        connection.close()
