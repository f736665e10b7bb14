"""Alerts a human must see: raised once, logged once, POSTed once.

Any app calls :func:`raise_alert` inside the transaction that makes the thing worth an
alert (a delivery marked ``exhausted``, a charge escalated to ``unresolved``, a dead
letter written); the queue does the rest::

    from jobs.operator.alerts import Severity, admin_path, raise_alert

    with transaction.atomic():
        if delivery_exhausted_cas(delivery):           # your compare-and-swap
            raise_alert(
                key=f"delivery_exhausted:{delivery.pk}",
                title=f"Webhook delivery {delivery.pk} exhausted its retries",
                source="webhooks.delivery_exhausted",
                severity=Severity.ERROR,
                details={"delivery_id": delivery.pk, "endpoint_id": delivery.endpoint_id},
                link=admin_path(delivery),
            )

What you get, for each ``key``, exactly once:

* an ``alerts`` row, written in *your* transaction (rolled back with it: no alert for work
  that did not commit), and a ``send_alert`` job with it;
* one log line with ``"alert": true`` and the alert's fields, written by the worker that
  runs the job;
* when ``ALERT_WEBHOOK_URL`` is set, one JSON POST (see :func:`incident_body`), from the
  worker, with connect and read/write timeouts, retried on its own schedule (:data:`ALERT_RETRY`)
  while the endpoint fails; the alert row records attempts and the last error. An endpoint
  that stays down dead-letters the ``send_alert`` job (replayable from the admin), never
  the thing you alerted about.

"Exactly once" holds because the key is unique (two racing transactions that raise the same
key make one row: the second waits for the first and inserts nothing) and because the log
line and the POST are each recorded on the row with a compare-and-swap before they are done
again. What remains at-least-once: a worker killed between a successful POST and recording
it sends again on retry, with the same ``dedup_key`` and ``Idempotency-Key``, which incident
tools use to fold duplicates; a commit that fails after the log line was written logs again.

Choose keys that name the event, not the moment: ``dead_letter:<id>``,
``charge_unresolved:<id>``. To alert again about the same thing later (an hourly re-alert),
put the period in the key: ``charge_unresolved:<id>:<hour>``.

Secrets: ``ALERT_WEBHOOK_URL`` may carry a token in its path or query. It is never logged,
stored or put in an exception message (errors are scrubbed of it before they are recorded).
Do not put secrets or personal data in ``title`` or ``details``: they go to a log and to a
third party.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping

import httpx
from django.conf import settings
from django.contrib.admin.utils import quote
from django.db import connection, transaction
from django.urls import reverse

from jobs import registry
from jobs.kinds import JobKind
from jobs.operator import alert_sql
from jobs.primitives.retry import RetryPolicy
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome
from vpay import metrics
from vpay.errors import ConfigurationError, Severity, TransientError, error_chain

__all__ = [
    "ALERT_RETRY",
    "Severity",
    "admin_change_path",
    "admin_path",
    "display_title",
    "incident_body",
    "raise_alert",
    "raise_counted_alert",
]

logger = logging.getLogger(__name__)

# Its own retry: quicker than the queue's default at first (an alert is worth most while
# fresh), then patient: 10 attempts whose backoff ceilings (10 s doubling, capped at 30 min)
# add up to about 72 minutes of endpoint outage before the alert job is dead-lettered.
ALERT_RETRY = RetryPolicy(max_attempts=10, base_seconds=10.0, cap_seconds=1800.0)
# Connect timeout, and the read/write timeout, of one POST; the job's own timeout sits above them.
CONNECT_TIMEOUT_SECONDS = 5.0
IO_TIMEOUT_SECONDS = 10.0

_KEY_MAX, _TITLE_MAX, _SOURCE_MAX, _LINK_MAX = 200, 300, 64, 500
# Incident tools (PagerDuty's Events API, Opsgenie, Better Stack) speak these four.
_INCIDENT_SEVERITY = {
    Severity.INFO: "info",
    Severity.WARNING: "warning",
    Severity.ERROR: "error",
    Severity.PAGE: "critical",
}
_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.ERROR: logging.ERROR}


def raise_alert(
    *,
    key: str,
    title: str,
    source: str,
    severity: Severity | str = Severity.ERROR,
    details: Mapping | None = None,
    link: str = "",
    correlation_id: str = "",
) -> int | None:
    """Raise the alert ``key`` once; returns its id, or ``None`` if ``key`` was raised before.

    MUST be called inside the caller's ``transaction.atomic()``: the alert commits (and is
    then logged and sent) if and only if that transaction commits.

    ``source``: who raises it, dotted (``webhooks.delivery_exhausted``). ``severity``:
    ``info``, ``warning``, ``error`` or ``page`` (``page`` wakes someone: "critical" to the
    incident tool). ``details``: a small JSON object for the log line and the POST.
    ``link``: an admin path (see :func:`admin_path`) or an absolute URL; a path is made
    absolute with ``VPAY_PUBLIC_URL``. Raises ``ValueError`` on bad arguments, before writing.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("raise_alert() must run inside the transaction that makes the alert true")
    if not isinstance(key, str) or not key.strip() or len(key) > _KEY_MAX:
        raise ValueError(f"alert key must be a non-empty string of at most {_KEY_MAX} characters")
    if not isinstance(source, str) or not source or len(source) > _SOURCE_MAX:
        raise ValueError(f"alert source must be a non-empty string of at most {_SOURCE_MAX} characters")
    try:
        severity = Severity(severity)
    except ValueError:
        raise ValueError(f"alert severity must be one of {', '.join(Severity)}") from None
    if len(link) > _LINK_MAX:
        raise ValueError(f"alert link must be at most {_LINK_MAX} characters")
    try:
        details_json = json.dumps(dict(details or {}), allow_nan=False, default=str)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"alert details must be a JSON object: {exc}") from None
    title = (title or key).strip()
    if len(title) > _TITLE_MAX:
        title = title[: _TITLE_MAX - 1] + "…"
    return alert_sql.raise_alert(
        key=key,
        title=title,
        severity=severity.value,
        source=source,
        details_json=details_json,
        link=link,
        correlation_id=(correlation_id or "")[:128],
    )


def raise_counted_alert(
    *,
    key: str,
    period: float,
    title: str,
    more_title: str,
    source: str,
    severity: Severity | str = Severity.ERROR,
    details: Mapping | None = None,
    occurrence: Mapping | None = None,
    link: str = "",
    correlation_id: str = "",
) -> tuple[int | None, int | None]:
    """Count one occurrence of ``key`` (one thing about one subject: ``<what>:<subject id>``)
    in the current period of ``period`` seconds (the database's clock), for things a
    merchant or any outsider can cause as often as they like: one page per period, not one
    per occurrence.

    The period's first occurrence raises an alert at once (``title``; ``details`` with
    ``count`` 1 and the ``occurrence`` as ``first``). Every later one is counted on the
    period's tally (``more_title``; ``details.count`` and the ``latest`` occurrence), which
    is logged and POSTed once, when the period ends, with the count it has then. Returns
    ``(first alert's id, None)`` or ``(None, tally's id)``.

    MUST be called inside the caller's transaction, like :func:`raise_alert`; the same
    arguments are refused the same way.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("raise_counted_alert() must run inside the transaction that makes the alert true")
    if not isinstance(period, int | float) or not 60 <= period <= 86400:
        raise ValueError("a counted alert's period is 60 to 86400 seconds")
    if not isinstance(key, str) or not key.strip() or len(key) > _KEY_MAX - 40:
        raise ValueError(f"a counted alert's key must be a non-empty string of at most {_KEY_MAX - 40} characters")
    if not isinstance(source, str) or not source or len(source) > _SOURCE_MAX:
        raise ValueError(f"alert source must be a non-empty string of at most {_SOURCE_MAX} characters")
    severity = Severity(severity)
    try:
        details_json = json.dumps(dict(details or {}), allow_nan=False, default=str)
        occurrence_json = json.dumps(dict(occurrence or {}), allow_nan=False, default=str)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"alert details must be a JSON object: {exc}") from None
    return alert_sql.raise_counted_alert(
        key=key,
        period=float(period),
        title=_bounded_title(title, key),
        more_title=_bounded_title(more_title, key),
        severity=severity.value,
        source=source,
        details_json=details_json,
        occurrence_json=occurrence_json,
        link=link[:_LINK_MAX],
        correlation_id=(correlation_id or "")[:128],
    )


def _bounded_title(title: str, key: str) -> str:
    title = (title or key).strip()
    return title if len(title) <= _TITLE_MAX else title[: _TITLE_MAX - 1] + "…"


def display_title(alert) -> str:
    """The title logged and POSTed: a counted alert's tally (``details.latest``) says how
    many it counts and over which period."""
    details = alert.details or {}
    if "latest" not in details:
        return alert.title
    return f"{alert.title}: {details.get('count')} between {details.get('period_start')} and {details.get('period_end')}"


def admin_path(instance) -> str:
    """The admin change page of a model instance, as a path (for :func:`raise_alert`'s ``link``)."""
    meta = instance._meta
    return admin_change_path(f"{meta.app_label}_{meta.model_name}", instance.pk)


def admin_change_path(model: str, pk) -> str:
    """The admin change page of ``pk`` of ``model`` (``"app_model"``), as a path.

    The key is quoted as the admin unquotes it: our ids are ``prefix_`` and 24 base62
    characters, and the admin reads ``_3A`` in a raw key as ``:``, so about one id in 190
    (``evt_3A…``, ``ch_2F…``) would open "doesn't exist" instead of its page.
    """
    return reverse(f"admin:{model}_change", args=[quote(pk)])


def absolute_link(link: str) -> str:
    if not link or "://" in link:
        return link
    return settings.VPAY_PUBLIC_URL.rstrip("/") + "/" + link.lstrip("/")


def incident_body(alert: alert_sql.AlertRow) -> dict:
    """The JSON document POSTed to ``ALERT_WEBHOOK_URL``.

    Flat fields an incident tool maps directly (``title``, ``severity``, ``dedup_key``,
    ``link``; and, for a dead letter, ``job_kind`` and ``dead_letter_id``), plus ``links``
    and ``details`` in the shape PagerDuty-style event APIs and generic webhooks accept.
    """
    link = absolute_link(alert.link)
    title = display_title(alert)
    body = {
        "title": title,
        "summary": title,
        "severity": _INCIDENT_SEVERITY[Severity(alert.severity)],
        "source": "vpay",
        "component": alert.source,
        "dedup_key": f"vpay:{alert.key}",
        "alert_id": alert.id,
        "created_at": alert.created_at.isoformat(),
        "link": link,
        "links": [{"href": link, "text": "Open in the vpay admin"}] if link else [],
        "details": alert.details,
    }
    if "dead_letter_id" in alert.details:
        body["dead_letter_id"] = alert.details["dead_letter_id"]
        body["job_kind"] = alert.details.get("kind", "")
    return body


@registry.register(
    JobKind.SEND_ALERT,
    schema=PayloadSchema(required={"alert_id": "int"}),
    timeout_seconds=30.0,
    retry=ALERT_RETRY,
)
def send_alert(ctx: JobContext) -> Outcome:
    """Log the alert (once) and POST it (once, when configured). Not fenced: both are
    compare-and-swaps on the alert row; the POST is retried while the endpoint fails."""
    alert = alert_sql.get_alert(ctx.payload["alert_id"])
    if alert is None:  # deleted by hand: nothing left to say
        return Outcome.done()
    if alert.logged_at is None:
        with transaction.atomic():
            if alert_sql.mark_alert_logged(alert.id):
                _log(alert)
    url = settings.ALERT_WEBHOOK_URL
    if not url or alert.sent_at is not None:
        return Outcome.done()
    _post(alert, url)
    alert_sql.mark_alert_sent(alert.id)
    return Outcome.done()


def _log(alert: alert_sql.AlertRow) -> None:
    severity = Severity(alert.severity)
    logger.log(
        _LOG_LEVEL.get(severity, logging.CRITICAL),
        f"ALERT: {display_title(alert)}",
        extra={
            "alert": True,
            "alert_id": alert.id,
            "alert_key": alert.key,
            "severity": severity.value,
            "source": alert.source,
            "link": absolute_link(alert.link),
            "details": alert.details,
        },
    )
    category = str(alert.details.get("error_category") or alert.source)
    metrics.ALERT_EVENTS.labels(category=category, severity=severity.value).inc()


def _post(alert: alert_sql.AlertRow, url: str) -> None:
    """One POST; raises a classified error (never one that names the URL) when it failed."""
    body = incident_body(alert)
    try:
        response = _client().post(url, json=body, headers={"Idempotency-Key": body["dedup_key"]})
    except httpx.HTTPError as exc:
        error = _scrub(error_chain(exc, 500), url)
        alert_sql.record_alert_failure(alert.id, f"alert endpoint unreachable: {error}")
        raise TransientError(f"alert {alert.id}: endpoint unreachable: {error}") from None
    if 200 <= response.status_code < 300:
        return
    error = f"alert endpoint answered HTTP {response.status_code}"
    alert_sql.record_alert_failure(alert.id, error)
    if response.status_code in (408, 425, 429) or response.status_code >= 500:
        raise TransientError(f"alert {alert.id}: {error}")
    # Any other 4xx (bad token, wrong URL, a redirect we do not follow) will not heal by
    # itself: a configuration error, dead-lettered (and alerted by its log line) at once.
    raise ConfigurationError(f"alert {alert.id}: {error}; check ALERT_WEBHOOK_URL")


_CLIENT: httpx.Client | None = None
_CLIENT_LOCK = threading.Lock()


def _client() -> httpx.Client:
    """One client per process, shared by the executors (httpx.Client is thread-safe):
    a new client per POST builds a TLS context each time, which cost more than the POST."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            _CLIENT = httpx.Client(
                timeout=httpx.Timeout(IO_TIMEOUT_SECONDS, connect=CONNECT_TIMEOUT_SECONDS),
                follow_redirects=False,
                headers={"User-Agent": "vpay-alerts/1"},
            )
        return _CLIENT


def _scrub(text: str, url: str) -> str:
    """``text`` without the webhook URL or any of its parts that could hold a token (the
    whole URL, its path, its query and each query value, any long path segment, the
    password)."""
    parsed = httpx.URL(url)
    secrets = {url, str(parsed), parsed.path, parsed.query.decode(errors="replace")}
    secrets |= {segment for segment in parsed.path.split("/") if len(segment) >= 8}
    secrets |= {value for _, value in parsed.params.multi_items() if len(value) >= 4}
    if parsed.userinfo:
        userinfo = parsed.userinfo.decode(errors="replace")
        secrets |= {userinfo, *userinfo.split(":", 1)[1:]}
    for secret in sorted((s for s in secrets if s and s != "/"), key=len, reverse=True):
        text = text.replace(secret, "[ALERT_WEBHOOK_URL]")
    return text
