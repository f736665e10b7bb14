"""Delivering one webhook attempt (the ``webhook_deliver`` job), in three steps.

1. :func:`begin_attempt` — one short transaction under the delivery's row lock: recover
   an expired lease, respect ``next_attempt_at`` and the endpoint's in-flight cap, then
   move the delivery to ``delivering`` and write the attempt row (``in_flight``, with a
   fresh lease token). It commits *before* anything is sent, so every request that ever
   left has a row.
2. :func:`perform` — render the event once, hash it and compare the digest with the one
   stored by the first attempt that may have sent it, sign it with every active secret,
   vet the address (SSRF guard) and POST it over a connection pinned to the vetted
   address. Nothing here writes to the database; it never raises for the network.
3. :func:`record` — one fenced transaction: the delivery moves only while this attempt's
   lease is still the delivery's and unexpired; otherwise the attempt is marked ``stale``
   and the answer discarded. Exhaustion and refusal are counted once, by the writer that
   made the transition, on their endpoint's alerts (``delivery_alerts``).

The handler is unfenced (it calls the network): it is idempotent because every write is
a compare-and-swap on the delivery's state and lease token. Tests drive the steps directly.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass

import httpx
from django.conf import settings
from django.db import DatabaseError, transaction

from jobs.operator.alerts import Severity, admin_path, raise_alert
from jobs.port import pull_forward_first
from vpay.errors import error_chain
from webhooks import attempt_errors, attempt_sql, metrics, repository, sealing, ssrf
from webhooks.decisions import AttemptResult, Next, after_failure, attempt_result, delivery_delay
from webhooks.models import AttemptState, DeliveryState, Event, WebhookDelivery
from webhooks.services import delivery_alerts, transport
from webhooks.services.shares import EndpointShares
from webhooks.signing import HEADER, signature_header

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
    """Step 1: claim the next attempt of ``delivery_id`` (see the module docstring).

    ``share``: the most attempts this process may have in flight to one endpoint, and to
    one merchant's endpoints together (the deliver job passes :func:`worker_share` of its
    worker); a CLAIMED result then holds a slot of each in :data:`SHARES` until
    :func:`release`."""
    with transaction.atomic():
        row = attempt_sql.lock_delivery(delivery_id)
        if row is None or row.state not in (DeliveryState.PENDING, DeliveryState.DELIVERING):
            return BeginResult(Begin.GONE)
        if row.state == DeliveryState.DELIVERING:
            if row.lease_left is not None and row.lease_left > 0:
                return BeginResult(Begin.BUSY, wait=row.lease_left)
            next_state = _recover(row)
            if next_state != DeliveryState.PENDING:
                return BeginResult(Begin.GONE)
            if row.endpoint_disabled:
                return BeginResult(Begin.HELD, endpoint_id=row.endpoint_id)
        elif row.endpoint_deleted:
            # Created by a fan-out that raced the delete, or left by an attempt that was in
            # flight during it: ended like the delete ended the others, without an alert.
            if repository.cancel_pending(row.id):
                metrics.DELIVERIES_FINISHED.labels(state=str(DeliveryState.CANCELLED)).inc()
            return BeginResult(Begin.GONE)
        elif row.endpoint_disabled:
            # Nothing is sent to a disabled endpoint and no rung is spent; re-enabling it
            # enqueues this delivery again (webhooks.services.endpoint_health).
            return BeginResult(Begin.HELD, endpoint_id=row.endpoint_id)
        elif row.due_in > 0:
            return BeginResult(Begin.NOT_DUE, wait=row.due_in)
        # The endpoint's share of this worker, then its merchant's (all its endpoints together,
        # one more than an endpoint's, so the merchant's other endpoints are not starved by
        # its slow one): a merchant with many slow endpoints is bounded as a whole.
        merchant_key = MERCHANT_SHARE_PREFIX + row.merchant_id
        held = share is not None and SHARES.acquire(row.endpoint_id, share)
        merchant_held = held and share is not None and SHARES.acquire(merchant_key, share + 1)
        keys = [row.endpoint_id, merchant_key][: int(held) + int(merchant_held)]
        try:
            in_flight, earliest = attempt_sql.in_flight_for_endpoint(row.endpoint_id)
            if (share is not None and not merchant_held) or in_flight >= settings.VPAY_WEBHOOK_MAX_IN_FLIGHT:
                for key in keys:
                    SHARES.release(key)
                metrics.AT_CAP.inc()
                return BeginResult(Begin.AT_CAP, wait=at_cap_wait(earliest), endpoint_id=row.endpoint_id)
            lease = attempt_sql.start_attempt(delivery_id, settings.VPAY_WEBHOOK_LEASE_SECONDS)
        except BaseException:
            for key in keys:
                SHARES.release(key)
            raise
        if keys:
            SHARES.bind(lease.token, *keys)
        return BeginResult(Begin.CLAIMED, lease=lease, endpoint_id=row.endpoint_id)


def hand_off(endpoint_id: str) -> int | None:
    """A slot of ``endpoint_id`` was just freed: pull the job of its longest-waiting due
    delivery forward, so the slot is used now rather than when that job's at-cap wait ends.
    Returns the delivery woken, if any. Best effort: the waiters' own timers are the backstop."""
    candidates = {dedupe_key(d): d for d in attempt_sql.waiting_deliveries(endpoint_id, HAND_OFF_CANDIDATES)}
    moved = pull_forward_first(list(candidates)) if candidates else None
    return candidates[moved] if moved is not None else None


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


@dataclass
class Attempted:
    """What :func:`perform` found out; :func:`record` writes it."""

    attempt_state: AttemptState
    delivery_state: DeliveryState | None = None  # set for a refusal (decided before sending)
    status_code: int | None = None
    excerpt: str = ""
    # What the merchant reads (webhooks.attempt_errors: a fixed phrase, nothing about vpay's
    # network); ``detail`` is the full account, for the operators' log line and alert only.
    error: str = ""
    detail: str = ""
    # The digest of a body that may have reached the receiver; None when nothing left the
    # process (unsigned, unresolved, refused, out of budget before the first byte): the
    # first stored digest is what every later attempt is compared with, so it must be of
    # a body a receiver may have seen.
    payload_sha256: str | None = None
    duration_ms: int | None = None
    connected_to: tuple[str, int] | None = None


def render_body(event: Event) -> bytes:
    """The exact bytes sent: the event rendered by the renderer ``GET /v1/events`` uses."""
    from webhooks.events import render_event

    return json.dumps(render_event(event), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def load(delivery_id: int) -> attempt_sql.Loaded | None:
    """The delivery with its event, its endpoint's URL and the endpoint's signing secrets
    still signing now, in one read (:func:`webhooks.attempt_sql.load_delivery`).

    The deliver job reads this *before* it claims the attempt (it names the host's breaker,
    and the attempt then sends what was read). Nothing read here decides whether to send:
    :func:`begin_attempt` decides that under the delivery's row lock, and the digest an
    attempt is compared with is the one that lock read (the lease carries it)."""
    return attempt_sql.load_delivery(delivery_id)


def perform(
    lease: attempt_sql.Lease,
    *,
    resolver: ssrf.Resolver = ssrf.system_resolver,
    loaded: attempt_sql.Loaded | None = None,
) -> Attempted:
    """Step 2: render, hash, sign, vet, POST. Never raises for the network or the receiver.

    ``loaded``: the delivery as :func:`load` read it before the claim (read now otherwise)."""
    delivery = loaded if loaded is not None else load(lease.delivery_id)
    if delivery is None:
        return Attempted(AttemptState.FAILED, error="the delivery is gone; nothing sent")
    if delivery.endpoint_deleted:
        return Attempted(
            AttemptState.FAILED, delivery_state=DeliveryState.CANCELLED, error="the endpoint was deleted; nothing sent"
        )
    body = render_body(delivery.event)
    digest = hashlib.sha256(body).hexdigest()
    # The digest stored by the first attempt that may have sent a body, as read under the
    # delivery's row lock when this attempt was claimed (the lease), so a digest recorded by
    # an attempt that ended just before this claim is never missed.
    if lease.payload_sha256 is not None and lease.payload_sha256 != digest:
        # The renderer no longer produces what was signed before: sending would put a
        # different body under the same event id. Fail loudly instead.
        with transaction.atomic():
            raise_alert(
                key=f"webhook_body_changed:{delivery.id}",
                title=f"Webhook delivery {delivery.id}: the rendered body changed since its first sent attempt",
                source="webhooks.body_changed",
                severity=Severity.ERROR,
                details={
                    "delivery_id": delivery.id,
                    "event_id": delivery.event_id,
                    "endpoint_id": delivery.endpoint_id,
                },
                link=admin_path(WebhookDelivery(pk=delivery.id)),
                correlation_id=delivery.event_id,
            )
        return Attempted(AttemptState.FAILED, error="rendered body differs from the first sent attempt; not sent")
    secrets = []
    for sealed in delivery.sealed_secrets:
        try:
            secrets.append(sealing.open_sealed_cached(sealed, delivery.endpoint_id))
        except sealing.SecretUnreadable:
            logger.warning(
                "a webhook secret is unreadable with the configured keys", extra={"endpoint": delivery.endpoint_id}
            )
    if not secrets:
        # Never an unsigned send: a failed attempt on the ladder (a key fix heals it).
        return Attempted(AttemptState.FAILED, error="the endpoint has no usable signing secret; nothing sent")
    headers = {
        HEADER: signature_header(body, secrets, lease.timestamp),
        "Vpay-Event-Id": delivery.event_id,
        "Vpay-Delivery-Attempt": str(lease.number),
    }
    # One budget for the whole attempt, resolution included: a merchant's slow nameserver
    # must not hold an executor beyond VPAY_WEBHOOK_TIMEOUT.
    started = time.monotonic()
    deadline = started + settings.VPAY_WEBHOOK_TIMEOUT
    try:
        url = httpx.URL(delivery.endpoint_url)
        if url.scheme not in ("http", "https") or not url.host or (settings.LIVE_MODE and url.scheme != "https"):
            return Attempted(AttemptState.FAILED, error="the endpoint URL is not deliverable (https only in live mode)")
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = ssrf.vet(
            url.host,
            port,
            allow=settings.VPAY_WEBHOOK_ALLOW_CIDRS,
            resolver=resolver,
            timeout=min(settings.VPAY_WEBHOOK_CONNECT_TIMEOUT, settings.VPAY_WEBHOOK_TIMEOUT),
        )
    except ssrf.AddressRefused as exc:
        if exc.permanent:
            return Attempted(
                AttemptState.FAILED,
                delivery_state=DeliveryState.REFUSED,
                error=attempt_errors.REFUSED,
                detail=f"refused by the SSRF guard: {exc}",
            )
        return Attempted(
            AttemptState.NO_RESPONSE,
            error=attempt_errors.unresolved(exc),
            detail=error_chain(exc, 1000),
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    except httpx.InvalidURL as exc:
        return Attempted(AttemptState.FAILED, error=attempt_errors.INVALID_URL, detail=error_chain(exc, 1000))
    left = deadline - time.monotonic()
    if left <= 0:
        return Attempted(
            AttemptState.NO_RESPONSE,
            error="the attempt's total timeout elapsed while resolving the host; nothing sent",
            duration_ms=int((time.monotonic() - started) * 1000),
        )
    answer = transport.post(
        str(url),
        body,
        headers,
        addresses=addresses,
        connect_timeout=settings.VPAY_WEBHOOK_CONNECT_TIMEOUT,
        total_timeout=left,
        keep=transport.kept_connections() if settings.VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS else None,
    )
    duration_ms = int((time.monotonic() - started) * 1000)
    result = attempt_result(answer.status_code)
    state = {
        AttemptResult.SUCCEEDED: AttemptState.SUCCEEDED,
        AttemptResult.FAILED: AttemptState.FAILED,
        AttemptResult.NO_RESPONSE: AttemptState.NO_RESPONSE,
    }[result]
    return Attempted(
        state,
        status_code=answer.status_code,
        excerpt=answer.excerpt,
        error=attempt_errors.transport(answer.error) if answer.error is not None else "",
        detail=error_chain(answer.error, 1000) if answer.error is not None else "",
        payload_sha256=digest if answer.sent else None,
        duration_ms=duration_ms,
        connected_to=answer.connected_to,
    )


def record(lease: attempt_sql.Lease, attempted: Attempted) -> attempt_sql.Recorded:
    """Step 3: write the outcome, fenced on the lease; alert once on exhaustion or refusal."""
    delay: float | None = None
    if attempted.delivery_state is not None:
        delivery_state = attempted.delivery_state
    elif attempted.attempt_state == AttemptState.SUCCEEDED:
        delivery_state = DeliveryState.SUCCEEDED
    else:
        next_, delay = after_failure(lease.rung, _schedule())
        delivery_state = DeliveryState.EXHAUSTED if next_ is Next.EXHAUSTED else DeliveryState.PENDING
    # A success writes one statement and alerts nothing: it needs no transaction of its own
    # (two round trips fewer on the path every delivery takes). Every other outcome may
    # alert, and the alert must commit with the transition that made it.
    with transaction.atomic() if delivery_state != DeliveryState.SUCCEEDED else contextlib.nullcontext():
        if delivery_state not in (DeliveryState.SUCCEEDED, DeliveryState.CANCELLED) and (
            attempt_sql.endpoint_deleted_for(lease.delivery_id)
        ):
            # Deleted while this attempt was in flight: no next rung, no exhaustion alert.
            delivery_state, delay = DeliveryState.CANCELLED, None
        recorded = attempt_sql.record_outcome(
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
        # Counted by the writer that made the transition, in its transaction: exactly once
        # (one page per endpoint and period: webhooks.services.delivery_alerts).
        if not recorded.stale and delivery_state in (DeliveryState.EXHAUSTED, DeliveryState.REFUSED):
            delivery = WebhookDelivery.objects.get(pk=lease.delivery_id)
            if delivery_state == DeliveryState.EXHAUSTED:
                delivery_alerts.alert_exhausted(
                    delivery_id=delivery.pk,
                    endpoint_id=delivery.endpoint_id,
                    event_id=delivery.event_id,
                    attempts=lease.number,
                )
            else:
                delivery_alerts.alert_refused(
                    delivery_id=delivery.pk,
                    endpoint_id=delivery.endpoint_id,
                    event_id=delivery.event_id,
                    reason=attempted.detail or attempted.error,
                )
    SHARES.release_lease(lease.token)  # first: the woken waiter may be claimed by this worker
    if not recorded.stale:
        try:
            hand_off(lease.endpoint_id)  # this attempt's slot is free: give it to a waiter now
        except DatabaseError:
            logger.warning("could not hand a freed slot on; the waiters' timers will", exc_info=True)
    metrics.ATTEMPTS.labels(outcome="stale" if recorded.stale else str(attempted.attempt_state)).inc()
    if attempted.duration_ms is not None:
        metrics.ATTEMPT_DURATION.observe(attempted.duration_ms / 1000)
    if not recorded.stale and delivery_state != DeliveryState.PENDING:
        metrics.DELIVERIES_FINISHED.labels(state=str(delivery_state)).inc()
    if attempted.detail:
        # The operators' account of what the merchant reads as a fixed phrase (the attempt
        # row keeps only that): the resolved address, the exception chain.
        logger.log(
            logging.WARNING if delivery_state == DeliveryState.REFUSED else logging.INFO,
            "webhook attempt failed: %s",
            attempted.error,
            extra={"delivery_id": lease.delivery_id, "attempt": lease.number, "error": attempted.detail},
        )
    if recorded.stale:
        logger.warning(
            "webhook attempt was stale: its lease expired first; answer discarded",
            # The row may already be abandoned (and keeps that): this line is where what the
            # late finisher heard is still told.
            extra={"delivery_id": lease.delivery_id, "attempt": lease.number, "status_code": attempted.status_code},
        )
    return recorded


def _schedule() -> tuple[float, ...]:
    return settings.VPAY_WEBHOOK_RETRY_SCHEDULE
