"""What a merchant is told about an attempt that failed before an answer was heard.

An attempt's ``error`` is the merchant's to read (``GET /v1/webhook_endpoints/{id}/deliveries``,
the ``/test`` answer), so it says *what kind* of failure it was in a fixed phrase and
nothing more: no address the host resolved to, no exception class, no errno text, no
resolver message. Those would let a merchant map vpay's network with endpoints of its own
choosing (a host that resolves to ``10.x.y.z`` says "private", one that does not exist on
the internal resolver says "Name or service not known"). The full account, the
``detail``, goes to the operators only: the worker's log line and, for a refusal, the alert
(``webhooks.services.delivery``).

Each phrase still tells the merchant what to look at on their side: DNS, the port, TLS,
their server's time to answer.
"""

from __future__ import annotations

import ssl

import httpx

# The SSRF guard refused every address or one of them: permanent (the delivery is ``refused``).
REFUSED = "refused: the host does not resolve to a public address"
# Resolution failed or took too long: an ordinary failed attempt (DNS blips heal).
UNRESOLVED = "the host could not be resolved"
RESOLVE_TIMEOUT = "the host did not resolve in time"
INVALID_URL = "the endpoint URL is invalid"

_TRANSPORT = (
    # Most specific first: a TLS failure arrives wrapped in a ConnectError.
    (ssl.SSLCertVerificationError, "TLS failed: the endpoint's certificate could not be verified"),
    (ssl.SSLError, "TLS failed: the handshake with the endpoint did not complete"),
    (httpx.ConnectTimeout, "timed out connecting to the endpoint"),
    (ConnectionRefusedError, "the endpoint refused the connection"),
    (httpx.ConnectError, "could not connect to the endpoint"),
    (httpx.WriteTimeout, "timed out sending the request"),
    (httpx.ReadTimeout, "timed out waiting for the endpoint's answer"),
    (httpx.TimeoutException, "the attempt timed out"),
    (httpx.RemoteProtocolError, "the endpoint closed the connection or did not answer in HTTP"),
    (httpx.WriteError, "the connection broke while sending the request"),
    (httpx.ReadError, "the connection broke while reading the answer"),
    (httpx.InvalidURL, INVALID_URL),
)
OTHER = "the request failed"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and any exception carried as an argument (httpcore
    wraps the socket's ``OSError`` that way, and the cause is not always kept)."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        seen.extend(arg for arg in current.args if isinstance(arg, BaseException))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return seen


def transport(exc: BaseException) -> str:
    """The merchant's phrase for a failed exchange (``webhooks.services.transport.Answer.error``)."""
    chain = _chain(exc)
    for kind, phrase in _TRANSPORT:
        if any(isinstance(link, kind) for link in chain):
            return phrase
    return OTHER


def unresolved(exc: BaseException) -> str:
    """The merchant's phrase for a resolution that failed (a non-permanent ``AddressRefused``)."""
    return RESOLVE_TIMEOUT if any(isinstance(link, TimeoutError) for link in _chain(exc)) else UNRESOLVED
