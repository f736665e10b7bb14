"""Delivering one webhook attempt (the ``webhook_deliver`` job), in three steps.

1. :func:`begin_attempts` — one short transaction under the deliveries' row locks: recover
   an expired lease, respect ``next_attempt_at`` and the endpoint's in-flight cap, then
   move the delivery to ``delivering`` and write the attempt row (``in_flight``, with a
   fresh lease token). It commits *before* anything is sent, so every request that ever
   left has a row.
2. :func:`perform` (``webhooks.services.sending``) — render the event once, hash it and
   compare the digest with the one stored by the first attempt that may have sent it, sign
   it with every active secret, vet the address (SSRF guard) and POST it over a connection
   pinned to the vetted address. Nothing here writes to the database; it never raises for
   the network.
3. :func:`record_many` — one fenced statement (a transaction where an outcome may alert):
   a delivery moves only while its attempt's lease is still the delivery's and unexpired;
   otherwise the attempt is marked ``stale`` and the answer discarded. Exhaustion and
   refusal are counted once, by the writer that made the transition, on their endpoint's
   alerts (``delivery_alerts``).

Steps 1 and 3 (and the read before step 1) take batches: the deliver jobs a worker's
executors run at the same moment share each step's transaction through a group commit
(:data:`LOADS`, :data:`BEGINS`, :data:`RECORDS`; ``jobs.primitives.group_commit``), each
attempt keeping its own row, lease token and fence. A lone attempt is a batch of one.

The handler is unfenced (it calls the network): it is idempotent because every write is
a compare-and-swap on the delivery's state and lease token. Tests drive the steps directly.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction

from jobs.port import pull_forward_waiting
from jobs.primitives.group_commit import GroupCommit
from webhooks import attempt_batch_sql, attempt_sql, metrics, repository
from webhooks.decisions import Next, after_failure, delivery_delay
from webhooks.models import AttemptState, DeliveryState
from webhooks.services import attempt_outcomes, delivery_alerts
from webhooks.services.sending import Attempted, perform, render_body  # noqa: F401 - step 2, read here with steps 1 and 3
from webhooks.services.shares import EndpointShares

logger = logging.getLogger("webhooks.delivery")

DEDUPE_PREFIX = "webhook_deliver:"
# A job that found its endpoint at the cap waits until the earliest in-flight lease could
# free a slot (the latest a slot can stay taken), plus up to this fraction of it as jitter,
# and never less than AT_CAP_MIN_WAIT. It is normally woken much sooner: every recorded
# attempt hands its slot to the endpoint's longest-waiting due delivery (pulls its job
# forward). So 20k deliveries queued behind one slow endpoint wake about once per lease
# each, and once per freed slot between them, instead of once a second each.
AT_CAP_MIN_WAIT = 1.0
AT_CAP_JITTER = 0.25
HAND_OFF_CANDIDATES = 3  # a candidate whose job is running right now cannot be pulled forward


def dedupe_key(delivery_id: int) -> str:
    """The deliver job's dedupe key: one live job per delivery, however often it is enqueued."""
    return f"{DEDUPE_PREFIX}{delivery_id}"


def worker_share(concurrency: int | None) -> int | None:
    """How many of one worker's executors a single endpoint may hold: half (at least
    one), so one slow endpoint, however high its cap, always leaves the other half of
    every worker to everyone else. None outside a worker (no threads to protect)."""
    return None if concurrency is None else max(1, concurrency // 2)


SHARES = EndpointShares()
MERCHANT_SHARE_PREFIX = "merchant:"  # a merchant's share is kept beside its endpoints' in SHARES


class Begin(enum.Enum):
    CLAIMED = "claimed"
    GONE = "gone"  # terminal (or no such delivery): nothing to do
    NOT_DUE = "not_due"
    BUSY = "busy"  # another attempt holds a live lease
    AT_CAP = "at_cap"  # the endpoint has its cap of attempts in flight
    HELD = "held"  # the endpoint is disabled: the delivery waits, pending, for it to be enabled


@dataclass(frozen=True)
class BeginResult:
    kind: Begin
    lease: attempt_sql.Lease | None = None
    wait: float = 0.0
    endpoint_id: str | None = None
    # CLAIMED: whether a batch may find other due deliveries to carry (False only when the
    # begin counted none beside those it claimed: at idle, the carrier then goes alone).
    others_due: bool = True


def release(begun: BeginResult) -> None:
    """Give back the per-worker share slot a claimed attempt held. :func:`record` does it
    (before handing the slot on); call this too where an attempt may end without a record
    (an exception): the second release is a no-op."""
    if begun.lease is not None:
        SHARES.release_lease(begun.lease.token)


def at_cap_wait(earliest_lease_left: float | None) -> float:
    """Seconds an at-cap job waits: until the earliest in-flight lease could free a slot,
    plus jitter (so the waiters of one endpoint do not all wake at the same instant)."""
    base = max(earliest_lease_left or 0.0, AT_CAP_MIN_WAIT)
    return base * (1.0 + AT_CAP_JITTER * random.random())


def begin_attempt(delivery_id: int, *, share: int | None = None) -> BeginResult:
    """Step 1 for one delivery: :func:`begin_attempts` of it alone."""
    return begin_attempts([(delivery_id, share)])[0]


def begin_attempts(requests: Sequence[tuple[int, int | None]]) -> list[BeginResult]:
    """Step 1: claim the next attempt of each ``(delivery_id, share)``, in one transaction
    (see the module docstring); one answer per request, in order. The deliver job asks
    through :data:`BEGINS`, so the executors that begin at the same moment share it.

    ``share``: the most attempts this process may have in flight to one endpoint, and to
    one merchant's endpoints together (the deliver job passes :func:`worker_share` of its
    worker); a CLAIMED result then holds a slot of each in :data:`SHARES` until
    :func:`release`. A delivery asked for twice in one batch is claimed once (the other: BUSY)."""
    results: dict[int, BeginResult] = {}
    try:
        with transaction.atomic():
            _begin_locked(requests, results)
    except BaseException:
        # Nothing of this transaction stands: the share slots its claims took are given back.
        for result in results.values():
            release(result)
        raise
    return [results[index] for index in range(len(requests))]


def _begin_locked(requests: Sequence[tuple[int, int | None]], results: dict[int, BeginResult]) -> None:
    """:func:`begin_attempts`' transaction: answers ``results`` by request index."""
    rows = attempt_batch_sql.lock_deliveries([delivery_id for delivery_id, _ in requests])
    candidates: list[tuple[attempt_sql.DeliveryRow, int | None]] = []
    # By endpoint, then delivery: a recovery's exhaustion alert locks its endpoint's alert row,
    # and two batches taking those locks in their own arrival orders could each wait for the other.
    ordered = sorted(
        enumerate(requests), key=lambda item: (getattr(rows.get(item[1][0]), "endpoint_id", ""), item[1][0], item[0])
    )
    for index, (delivery_id, share) in ordered:
        row = rows.get(delivery_id)
        if any(delivery_id == other for other, _ in requests[:index]):
            results[index] = BeginResult(Begin.BUSY, wait=0.0)
            continue
        found = _before_the_cap(row)
        if found is not None:
            results[index] = found
        else:
            assert row is not None
            candidates.append((row, share))
    _claim_under_the_cap(requests, candidates, results)


def _before_the_cap(row: attempt_sql.DeliveryRow | None) -> BeginResult | None:
    """What a locked delivery's state decides before its endpoint's cap is asked: an answer,
    or None for a delivery due now (one whose expired lease this recovers included)."""
    if row is None or row.state not in (DeliveryState.PENDING, DeliveryState.DELIVERING):
        return BeginResult(Begin.GONE)
    if row.state == DeliveryState.DELIVERING:
        if row.lease_left is not None and row.lease_left > 0:
            return BeginResult(Begin.BUSY, wait=row.lease_left)
        if _recover(row) != DeliveryState.PENDING:
            return BeginResult(Begin.GONE)
        if row.endpoint_disabled:
            return BeginResult(Begin.HELD, endpoint_id=row.endpoint_id)
        return None
    if row.endpoint_deleted:
        # Created by a fan-out that raced the delete, or left by an attempt that was in
        # flight during it: ended like the delete ended the others, without an alert.
        if repository.cancel_pending(row.id):
            metrics.DELIVERIES_FINISHED.labels(state=str(DeliveryState.CANCELLED)).inc()
        return BeginResult(Begin.GONE)
    if row.endpoint_disabled:
        # Nothing is sent to a disabled endpoint and no rung is spent; re-enabling it
        # enqueues this delivery again (webhooks.services.endpoint_health).
        return BeginResult(Begin.HELD, endpoint_id=row.endpoint_id)
    if row.due_in > 0:
        return BeginResult(Begin.NOT_DUE, wait=row.due_in)
    return None


def _claim_under_the_cap(
    requests: Sequence[tuple[int, int | None]],
    candidates: list[tuple[attempt_sql.DeliveryRow, int | None]],
    results: dict[int, BeginResult],
) -> None:
    """Start the candidates' attempts that their endpoints' caps and this worker's shares
    allow (in the candidates' order), answering AT_CAP for the rest, in the caller's transaction."""
    if not candidates:
        return
    in_flight = attempt_batch_sql.in_flight_for_endpoints([row.endpoint_id for row, _ in candidates])
    taken: dict[str, int] = {}
    starting: dict[int, tuple[str, ...]] = {}  # delivery id -> the share slots its lease will hold
    keys: tuple[str, ...] = ()
    try:
        for row, share in candidates:
            # The endpoint's share of this worker, then its merchant's (all its endpoints
            # together, one more than an endpoint's, so the merchant's other endpoints are not
            # starved by its slow one): a merchant with many slow endpoints is bounded as a whole.
            merchant_key = MERCHANT_SHARE_PREFIX + row.merchant_id
            held = share is not None and SHARES.acquire(row.endpoint_id, share)
            merchant_held = held and share is not None and SHARES.acquire(merchant_key, share + 1)
            keys = (row.endpoint_id, merchant_key)[: int(held) + int(merchant_held)]
            count, earliest, _ = in_flight[row.endpoint_id]
            if (share is not None and not merchant_held) or count + taken.get(row.endpoint_id, 0) >= (
                settings.VPAY_WEBHOOK_MAX_IN_FLIGHT
            ):
                for key in keys:
                    SHARES.release(key)
                keys = ()
                metrics.AT_CAP.inc()
                results[_index(requests, row.id)] = BeginResult(
                    Begin.AT_CAP, wait=at_cap_wait(earliest), endpoint_id=row.endpoint_id
                )
                continue
            taken[row.endpoint_id] = taken.get(row.endpoint_id, 0) + 1
            starting[row.id], keys = keys, ()
        leases = (
            attempt_batch_sql.start_attempts(list(starting), settings.VPAY_WEBHOOK_LEASE_SECONDS) if starting else {}
        )
    except BaseException:
        for held_keys in (*starting.values(), keys):  # no lease binds them yet
            for key in held_keys:
                SHARES.release(key)
        raise
    for delivery_id, keys in starting.items():
        lease = leases[delivery_id]
        if keys:
            SHARES.bind(lease.token, *keys)
        # Due beyond those claimed: one the worker's share turned away is carried (no share taken).
        due = in_flight[lease.endpoint_id][2]
        others = due is None or due > taken[lease.endpoint_id]
        results[_index(requests, delivery_id)] = BeginResult(
            Begin.CLAIMED, lease, endpoint_id=lease.endpoint_id, others_due=others
        )


def _index(requests: Sequence[tuple[int, int | None]], delivery_id: int) -> int:
    return next(i for i, (did, _) in enumerate(requests) if did == delivery_id)


def hand_off(endpoint_id: str, slots: int = 1) -> list[int]:
    """``slots`` of ``endpoint_id`` were just freed: pull the jobs of as many of its
    longest-waiting due deliveries forward, so the slots are used now rather than when those
    jobs' at-cap waits end. Returns the deliveries woken. Best effort: the waiters' own
    timers are the backstop."""
    candidates = {
        dedupe_key(d): d for d in attempt_sql.waiting_deliveries(endpoint_id, slots + HAND_OFF_CANDIDATES - 1)
    }
    return [candidates[name] for name in pull_forward_waiting(list(candidates), slots)] if candidates else []


def _recover(row: attempt_sql.DeliveryRow) -> str:
    """An expired lease: the attempt is ``abandoned`` and counts as a failed try (or, if
    the endpoint was deleted meanwhile, the delivery is ``cancelled``: nothing to alert)."""
    rung = row.attempts - row.ladder_base
    if row.endpoint_deleted:
        next_state = DeliveryState.CANCELLED
    elif delivery_delay(rung, _schedule()) is not None:
        next_state = DeliveryState.PENDING
    else:
        next_state = DeliveryState.EXHAUSTED
    attempt_sql.recover_lease(row, next_state)
    metrics.ATTEMPTS_ABANDONED.inc()
    logger.warning(
        "webhook attempt abandoned: its lease expired",
        extra={"delivery_id": row.id, "attempt": row.attempts, "next_state": str(next_state)},
    )
    if next_state == DeliveryState.EXHAUSTED:
        delivery_alerts.alert_exhausted(
            delivery_id=row.id, endpoint_id=row.endpoint_id, event_id=row.event_id, attempts=row.attempts
        )
    return next_state


def recover_expired(delivery_id: int) -> str | None:
    """Backstop: recover one delivery whose lease expired; returns its new state, or None
    if it no longer needed recovering."""
    with transaction.atomic():
        row = attempt_sql.lock_delivery(delivery_id)
        if row is None or row.state != DeliveryState.DELIVERING or (row.lease_left or 0) > 0:
            return None
        return _recover(row)


def load(delivery_id: int) -> attempt_sql.Loaded | None:
    """:func:`load_many` of one delivery."""
    return load_many([delivery_id])[0]


def load_many(delivery_ids: Sequence[int]) -> list[attempt_sql.Loaded | None]:
    """Each delivery with its event, its endpoint's URL and the endpoint's signing secrets
    still signing now, in one read (:func:`webhooks.attempt_batch_sql.load_deliveries`).

    The deliver job reads this *before* it claims the attempt (it names the host's breaker,
    and the attempt then sends what was read). Nothing read here decides whether to send:
    :func:`begin_attempts` decides that under the delivery's row lock, and the digest an
    attempt is compared with is the one that lock read (the lease carries it)."""
    loaded = attempt_batch_sql.load_deliveries(delivery_ids)
    return [loaded.get(delivery_id) for delivery_id in delivery_ids]


def record(lease: attempt_sql.Lease, attempted: Attempted) -> attempt_sql.Recorded:
    """Step 3 for one attempt: :func:`record_many` of it alone."""
    return record_many([(lease, attempted)])[0]


def record_many(answers: Sequence[tuple[attempt_sql.Lease, Attempted]]) -> list[attempt_sql.Recorded]:
    """Step 3: write each outcome, fenced on its lease, in one statement; alert once on
    exhaustion or refusal. Then each freed slot is handed on. The deliver job records
    through :data:`RECORDS`, so the executors that record at the same moment share it."""
    outcomes = [_outcome(lease, attempted) for lease, attempted in answers]
    # Successes alert nothing: a batch of them needs no transaction of its own (two round
    # trips fewer on the path every delivery takes). Any other outcome may alert, and the
    # alert must commit with the transition that made it.
    failing = [o.lease.delivery_id for o in outcomes if o.delivery_state != DeliveryState.SUCCEEDED]
    with transaction.atomic() if failing else contextlib.nullcontext():
        deleted = attempt_batch_sql.endpoints_deleted_for(failing) if failing else set()
        outcomes = [
            # Deleted while this attempt was in flight: no next rung, no exhaustion alert.
            replace(o, delivery_state=DeliveryState.CANCELLED, delay=None)
            if o.lease.delivery_id in deleted and o.delivery_state != DeliveryState.CANCELLED
            else o
            for o in outcomes
        ]
        moved = attempt_batch_sql.record_outcomes(outcomes)
        # In endpoint order: an alert locks its endpoint's alert row, and two batches taking
        # those locks in their own arrival orders could each wait for the other.
        for outcome, attempted, did_move in sorted(
            zip(outcomes, (a for _, a in answers), moved, strict=True),
            key=lambda x: (x[0].lease.endpoint_id, x[0].delivery_state),
        ):
            if did_move:
                attempt_outcomes.alert(outcome, attempted)
    # Committed: what follows is bookkeeping, and must not fail the batch (a failed batch is
    # run again, and its attempts would then be recorded as stale).
    freed: dict[str, int] = {}
    for outcome, (lease, attempted), did_move in zip(outcomes, answers, moved, strict=True):
        SHARES.release_lease(lease.token)  # first: the woken waiter may be claimed by this worker
        if did_move:
            freed[lease.endpoint_id] = freed.get(lease.endpoint_id, 0) + 1
        try:
            attempt_outcomes.account(outcome, attempted, did_move)
        except Exception:
            logger.exception("could not account for a recorded webhook attempt")
    for endpoint_id, slots in freed.items():
        try:
            hand_off(endpoint_id, slots)  # these attempts' slots are free: give them to waiters now
        except Exception:
            logger.warning("could not hand a freed slot on; the waiters' timers will", exc_info=True)
    return [
        attempt_sql.Recorded(False, outcome.delivery_state) if did_move else attempt_sql.Recorded(True)
        for outcome, did_move in zip(outcomes, moved, strict=True)
    ]


def _outcome(lease: attempt_sql.Lease, attempted: Attempted) -> attempt_batch_sql.Outcome:
    """The delivery's next state after this answer, by the ladder."""
    delay: float | None = None
    if attempted.delivery_state is not None:
        delivery_state = attempted.delivery_state
    elif attempted.attempt_state == AttemptState.SUCCEEDED:
        delivery_state = DeliveryState.SUCCEEDED
    else:
        next_, delay = after_failure(lease.rung, _schedule())
        delivery_state = DeliveryState.EXHAUSTED if next_ is Next.EXHAUSTED else DeliveryState.PENDING
    return attempt_batch_sql.Outcome(
        lease,
        attempt_state=attempted.attempt_state,
        delivery_state=delivery_state,
        delay=delay,
        status_code=attempted.status_code,
        excerpt=attempted.excerpt,
        error=attempted.error,
        payload_sha256=attempted.payload_sha256,
        duration_ms=attempted.duration_ms,
    )


def _schedule() -> tuple[float, ...]:
    return settings.VPAY_WEBHOOK_RETRY_SCHEDULE


# Group commits of the deliver job's steps, one of each per process (see the module docstring).
# A batch is at most a worker's executors; the bound only keeps one transaction short.
BATCH_MAX = 64
LOADS: GroupCommit[int, attempt_sql.Loaded | None] = GroupCommit(load_many, max_batch=BATCH_MAX)
BEGINS: GroupCommit[tuple[int, int | None], BeginResult] = GroupCommit(begin_attempts, max_batch=BATCH_MAX)
RECORDS: GroupCommit[tuple[attempt_sql.Lease, Attempted], attempt_sql.Recorded] = GroupCommit(
    record_many, max_batch=BATCH_MAX
)
