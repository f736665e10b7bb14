"""The rail HTTP protocol (docs/architecture.md §5) and the one adapter that speaks it.

``POST {base}/charges`` ``{reference, amount, currency}`` with ``Idempotency-Key:
reference`` and ``GET {base}/charges/{reference}`` (with ``pay_token`` on redirect rails)
both answer ``{status: pending|succeeded|failed, pay_token?, redirect_url?, failure_code?}``;
a 404 on the GET means the rail does not know the reference.

Refunds extend it: ``POST {base}/refunds`` ``{reference, charge_reference, amount,
currency}`` with ``Idempotency-Key: reference`` and ``GET {base}/refunds/{reference}``
answer ``{reference, status: pending|succeeded|failed, failure_code?}``, 404 on the GET
when the rail does not know it. Both go through the same ``_call``, so a refund's answer is
classified exactly as a charge's is.

Manual capture extends it again: a submit with ``capture: false`` is an authorization, which
a poll reports ``authorized`` (with ``amount_capturable``) where it would report
``succeeded``. ``POST {base}/charges/{reference}/capture`` ``{amount}`` (``Idempotency-Key:
reference:capture``, then ``reference:capture:<n>`` for the n-th capture asked for after a
refusal) answers ``{status: succeeded, amount_captured}``; ``POST
{base}/charges/{reference}/void`` (``Idempotency-Key: reference:void``) answers the charge
as it stands after it (``canceled`` once the hold is released; ``succeeded`` or ``failed``
when the money had already moved or never would), 404 when the rail holds nothing. A
captured charge's polls answer ``succeeded`` with ``amount_captured``, a voided one's
``canceled``.

Failures are classified with ``vpay.errors``' vocabulary, so the worker and the web
process agree on them. Only a definitive refusal may end a charge, because anything short
of one can hide a charge the rail took and a payer may still approve:

* **refused for good** (``RailRejected``): a 4xx the protocol defines as a refusal, that is
  every 4xx but those below; and, inside a readable answer, ``status: failed``;
* **configuration** (``RailConfigurationError``): 401/403, our credentials; page someone;
* **transient** (``RailUnavailable``), everything else: timeouts, transport failures, 5xx,
  408, 409 (the rail is still processing that idempotency key), 425, 429, a 3xx (never
  followed), and whatever the adapter cannot read: a 2xx that is not JSON (compressed
  although ``Accept-Encoding: identity`` asked it not to be, nested past the parser's
  limit), too large, or with no known status, and any other ``httpx.HTTPError``. Nothing a
  rail sends escapes as an error of ours. ``Retry-After`` on such an answer is kept as
  ``retry_after`` (ASCII seconds or a date, bounded; anything else is no delay).

The adapter records nothing itself: the caller writes ``provider_requests`` before and after.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import quote

import httpx

from charges.rails.config import RailConfig
from charges.rails.deadline import bound_every_pool, exchange
from charges.rails.excerpts import read, unstorable
from charges.states import RailStatus
from vpay.errors import ConfigurationError, PermanentError, TransientError

MAX_BODY_BYTES = 64 * 1024
_ANSWER_STATUSES = {"pending", "succeeded", "failed", "authorized", "canceled"}
# 4xx answers that refuse nothing for good: a timeout, an idempotency key still being
# processed, too early, too many requests. Asking again later is the protocol's answer.
_TRANSIENT_4XX = frozenset({408, 409, 425, 429})
# A rail's Retry-After is honoured up to this (one past-the-horizon rung): a rail cannot
# park a charge's polling for days by asking for it.
RETRY_AFTER_MAX_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class RailAnswer:
    """A rail's answer: its status, what the flow needs, and what to record."""

    status: RailStatus
    http_status: int
    pay_token: str | None = None
    redirect_url: str | None = None
    failure_code: str | None = None
    body_excerpt: str = ""
    amount_captured: int | None = None  # on a captured charge's answer

    def __repr__(self) -> str:  # the pay_token and the URL carrying it are credentials of the payer's order
        return f"RailAnswer(status={self.status.value!r}, http_status={self.http_status}, failure_code={self.failure_code!r})"


class RailError(Exception):
    """Base of the adapter's failures; ``http_status`` is None when nothing answered."""

    http_status: int | None = None
    body_excerpt: str = ""
    retry_after: float | None = None  # seconds the rail asked us to wait (Retry-After), bounded


class RailUnavailable(RailError, TransientError):
    """No usable answer (timeout, transport, 5xx, 408/409/425/429, 3xx, unreadable 2xx): ask again later."""


class RailConfigurationError(RailError, ConfigurationError):
    """401/403: the rail refused our credentials. Page someone."""


class RailRejected(RailError, PermanentError):
    """Any other 4xx: the rail refused the request for good."""


def _error(
    cls: type[RailError],
    message: str,
    http_status: int | None,
    excerpt: str = "",
    retry_after: float | None = None,
) -> RailError:
    exc = cls(message)
    exc.http_status = http_status
    exc.body_excerpt = excerpt
    exc.retry_after = retry_after
    return exc


def retry_after_seconds(value: str | None, rail_date: str | None) -> float | None:
    """A ``Retry-After`` header as seconds in ``[0, RETRY_AFTER_MAX_SECONDS]``, or None.

    The delay form is read as it is. The date form is measured against the answer's own
    ``Date`` header, both instants of the rail's clock, so no clock of ours is compared
    with one of theirs; without a readable ``Date`` it is ignored (the caller's own
    schedule stands).
    """
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only (RFC 9110's delay-seconds): str.isdigit() is also true of "²" and
    # "٣", which float() refuses or reads as a number the rail never wrote.
    if value.isascii() and value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_SECONDS)
    if not rail_date:
        return None
    try:
        wait = (parsedate_to_datetime(value) - parsedate_to_datetime(rail_date)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(wait, 0.0), RETRY_AFTER_MAX_SECONDS)


def capture_key(reference: str, attempt: int = 0) -> str:
    """A capture's idempotency key: one capture per time it was asked for, however often it is
    sent. ``attempt`` counts the captures asked for before (each refused for good, so a new
    key cannot capture twice): a rail that replays a key's refusal must not refuse the next."""
    return f"{reference}:capture" if attempt == 0 else f"{reference}:capture:{attempt}"


def void_key(reference: str) -> str:
    return f"{reference}:void"


class RailAdapter(Protocol):
    """What the charge services need from a rail."""

    def submit(self, *, reference: str, amount: int, currency: str, capture: bool = True) -> RailAnswer: ...

    def status(self, *, reference: str, pay_token: str | None) -> RailAnswer: ...

    def capture(self, *, reference: str, amount: int, idempotency_key: str) -> RailAnswer: ...

    def void(self, *, reference: str) -> RailAnswer: ...

    def refund(self, *, reference: str, charge_reference: str, amount: int, currency: str) -> RailAnswer: ...

    def refund_status(self, *, reference: str) -> RailAnswer: ...


class HttpRailAdapter:
    """The rail protocol over httpx, with a connect timeout and a hard total deadline.

    httpx has no total timeout of its own (its read timeout applies to each read, so a rail
    trickling header bytes could hold a call open indefinitely). Every connect, write and
    read on the connection is given only what is left of one deadline, ``total_timeout``
    from the start of the call, so the whole exchange — pool wait, connect, TLS, request,
    status line, headers, body — ends by then, give or take one socket operation's
    scheduling. The crash-recovery window's startup check relies on it.
    """

    def __init__(self, rail: RailConfig, *, connect_timeout: float, total_timeout: float) -> None:
        self.rail = rail
        self.connect_timeout = connect_timeout
        self.total_timeout = total_timeout
        self._client = httpx.Client(
            follow_redirects=False,  # a redirect is an answer, never a second request with our key
            headers={
                "Authorization": f"Bearer {rail.api_key}",
                "User-Agent": "vpay-rail-adapter",
                # The body is read as sent (iter_raw), never decoded: a Content-Encoding that
                # lies cannot fail the read, and no compressed answer is inflated in memory.
                "Accept-Encoding": "identity",
            },
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )
        bound_every_pool(self._client)

    def __repr__(self) -> str:
        return f"HttpRailAdapter({self.rail!r})"

    def submit(self, *, reference: str, amount: int, currency: str, capture: bool = True) -> RailAnswer:
        body: dict = {"reference": reference, "amount": amount, "currency": currency}
        if not capture:
            body["capture"] = False  # an authorization; an automatic charge's body is unchanged
        return self._call("POST", "/charges", json_body=body, headers={"Idempotency-Key": reference})

    def capture(self, *, reference: str, amount: int, idempotency_key: str) -> RailAnswer:
        path = f"/charges/{quote(reference, safe='')}/capture"
        return self._call("POST", path, json_body={"amount": amount}, headers={"Idempotency-Key": idempotency_key})

    def void(self, *, reference: str) -> RailAnswer:
        # 404 is an answer: the rail holds nothing under the reference, so nothing is held.
        path = f"/charges/{quote(reference, safe='')}/void"
        return self._call(
            "POST", path, json_body={}, headers={"Idempotency-Key": void_key(reference)}, not_found_is_answer=True
        )

    def status(self, *, reference: str, pay_token: str | None) -> RailAnswer:
        params = {"pay_token": pay_token} if pay_token else None
        return self._call("GET", f"/charges/{quote(reference, safe='')}", params=params, not_found_is_answer=True)

    def refund(self, *, reference: str, charge_reference: str, amount: int, currency: str) -> RailAnswer:
        body = {"reference": reference, "charge_reference": charge_reference, "amount": amount, "currency": currency}
        return self._call("POST", "/refunds", json_body=body, headers={"Idempotency-Key": reference})

    def refund_status(self, *, reference: str) -> RailAnswer:
        return self._call("GET", f"/refunds/{quote(reference, safe='')}", not_found_is_answer=True)

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: dict | None = None,
        params: dict | None = None,
        headers: dict | None = None,
        not_found_is_answer: bool = False,
    ) -> RailAnswer:
        deadline = time.monotonic() + self.total_timeout
        timeout = httpx.Timeout(self.total_timeout, connect=min(self.connect_timeout, self.total_timeout))
        url = self.rail.base_url + path
        exchange.deadline = deadline
        try:
            request = self._client.build_request(
                method, url, json=json_body, params=params, headers=headers, timeout=timeout
            )
            # Straight to the client's transport for the URL (an environment proxy's included),
            # as the webhook sender does: the client's send layer (auth, redirects, hooks, a
            # cookie jar no rail call should carry) was 6 % of the worker's CPU a settled
            # charge (bench/CHARGES.md). _transport_for_url is httpx's private, for that
            # measured reason (httpx pinned; tests/test_rails.py goes through a proxy).
            response = self._client._transport_for_url(request.url).handle_request(request)
            try:
                raw, oversized = bytearray(), False
                for chunk in response.iter_raw():
                    raw += chunk
                    if len(raw) > MAX_BODY_BYTES:
                        oversized = True  # unreadable; its status still says what it is
                        break
                    if time.monotonic() > deadline:
                        raise httpx.ReadTimeout("total timeout exceeded while reading the answer")
                code = response.status_code
                retry_after = retry_after_seconds(response.headers.get("Retry-After"), response.headers.get("Date"))
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            raise _error(RailUnavailable, f"rail {self.rail.code}: timed out ({type(exc).__name__})", None) from exc
        except httpx.TransportError as exc:
            raise _error(RailUnavailable, f"rail {self.rail.code}: no answer ({type(exc).__name__})", None) from exc
        except httpx.HTTPError as exc:
            # Anything else httpx could not make of the exchange: no answer we can read.
            raise _error(RailUnavailable, f"rail {self.rail.code}: unreadable ({type(exc).__name__})", None) from exc
        finally:
            exchange.deadline = None
        body, excerpt = read(raw, oversized, MAX_BODY_BYTES)
        if code >= 500 or code in _TRANSIENT_4XX or 300 <= code < 400:
            raise _error(RailUnavailable, f"rail {self.rail.code}: HTTP {code}", code, excerpt, retry_after)
        if code in (401, 403):
            raise _error(
                RailConfigurationError,
                f"rail {self.rail.code}: HTTP {code}, our credentials were refused",
                code,
                excerpt,
            )
        if code == 404 and not_found_is_answer:
            return RailAnswer(RailStatus.NOT_FOUND, code, body_excerpt=excerpt)
        if code >= 400:
            raise _error(RailRejected, f"rail {self.rail.code}: HTTP {code}", code, excerpt)
        return _parse(self.rail.code, code, body, excerpt, retry_after)


def _parse(code: str, http_status: int, body: object, excerpt: str, retry_after: float | None) -> RailAnswer:
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("status"), str)
        or body["status"] not in _ANSWER_STATUSES
        or any(unstorable(body.get(k)) for k in ("pay_token", "redirect_url", "failure_code"))
    ):
        # A 2xx we cannot read is no answer we may act on, and no refusal either: the rail
        # may well have taken the charge. Transient, so the charge stays live and polled.
        # So is one whose text we would store and cannot (a NUL, a lone surrogate).
        raise _error(
            RailUnavailable, f"rail {code}: unreadable answer to a {http_status}", http_status, excerpt, retry_after
        )

    def text_field(name: str) -> str | None:
        value = body.get(name)
        return value if isinstance(value, str) and value else None

    captured = body.get("amount_captured")

    return RailAnswer(
        RailStatus(body["status"]),
        http_status,
        pay_token=text_field("pay_token"),
        redirect_url=text_field("redirect_url"),
        failure_code=(text_field("failure_code") or "")[:64] or None,
        body_excerpt=excerpt,
        amount_captured=captured if type(captured) is int and captured > 0 else None,
    )


_adapters: dict[str, HttpRailAdapter] = {}
_adapters_lock = threading.Lock()


def adapter_for(rail: RailConfig) -> HttpRailAdapter:
    """The process's adapter for ``rail`` (one connection pool per rail, shared by threads)."""
    from django.conf import settings

    connect, total = settings.VPAY_RAIL_CONNECT_TIMEOUT_SECONDS, settings.VPAY_RAIL_TIMEOUT_SECONDS
    with _adapters_lock:
        adapter = _adapters.get(rail.code)
        if adapter is None or (adapter.rail, adapter.connect_timeout, adapter.total_timeout) != (rail, connect, total):
            adapter = HttpRailAdapter(rail, connect_timeout=connect, total_timeout=total)
            _adapters[rail.code] = adapter
        return adapter
