"""One HTTP POST to a vetted, pinned address, with a total deadline and a bounded read.

The SSRF guard's answer is only worth something if the connection goes where it was
vetted: a second DNS lookup at connect time could answer differently (DNS rebinding).
:class:`PinnedBackend` is an httpcore network backend that ignores the hostname httpcore
asks it to connect to and dials only the vetted addresses; httpcore still passes the URL's
hostname to TLS, so SNI and certificate verification are for the host the merchant
configured, not for an IP.

Also here, because they are properties of the connection, not of the caller:
* no proxy from the environment (a proxy would re-resolve the host on our behalf),
  no redirects (a 3xx is an answer like any other non-2xx), no decompression;
* one deadline for the whole attempt: every socket read and write is given only what is
  left of it, so a receiver dripping one byte a second cannot stretch an attempt;
* the answer's body is read up to ``excerpt_bytes`` and the connection is then closed, so
  an endless body costs one buffer, never the worker;
* whether any of the request may have reached the receiver (:attr:`Answer.sent`): a
  refused connection, a failed TLS handshake or a budget spent before the first write
  sent nothing, and the delivery's digest is only ever of a body that may have left.
"""

from __future__ import annotations

import ssl
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpcore
import httpx

from vpay.http_deadline import DeadlineStream
from webhooks.ssrf import IPAddress

USER_AGENT = "vpay-webhooks/1"
EXCERPT_BYTES = 4096


class PinnedBackend(httpcore.NetworkBackend):
    """Connects to the vetted addresses, in order, whatever host httpcore asks for."""

    def __init__(self, addresses: Sequence[IPAddress], deadline: float) -> None:
        if not addresses:
            raise ValueError("no vetted address to connect to")
        self.addresses = list(addresses)
        self.deadline = deadline
        self.connected_to: tuple[str, int] | None = None
        self.wrote = False  # set at the first write of the request (after any TLS handshake)
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        errors: list[Exception] = []
        for address in self.addresses:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            try:
                stream = self._inner.connect_tcp(
                    str(address),
                    port,
                    timeout=left if timeout is None else min(timeout, left),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                errors.append(exc)
                continue
            self.connected_to = (str(address), port)
            return _WriteWatch(DeadlineStream(stream, lambda: self.deadline, "the webhook attempt"), self)
        if errors:
            raise errors[-1]
        raise httpcore.ConnectTimeout("the webhook attempt's total timeout elapsed before connecting")

    def connect_unix_socket(self, *args, **kwargs) -> httpcore.NetworkStream:  # pragma: no cover
        raise httpcore.ConnectError("webhooks are never delivered over a Unix socket")

    def sleep(self, seconds: float) -> None:  # pragma: no cover - only used by httpcore retries (0)
        time.sleep(seconds)


class _WriteWatch(httpcore.NetworkStream):
    """Tells its backend when the request's first byte is handed to the socket. The TLS
    handshake runs on the socket itself, never through :meth:`write`, so a write is the
    request (its head first), and a failed one may still have sent part of it."""

    def __init__(self, inner: httpcore.NetworkStream, backend: PinnedBackend) -> None:
        self._inner = inner
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self._backend.wrote = True  # before the call: a write that fails may have sent some
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _WriteWatch(self._inner.start_tls(ssl_context, server_hostname, timeout), self._backend)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _PinnedTransport(httpx.HTTPTransport):
    """httpx's own transport (its exception mapping, its response streams) over a pinned pool."""

    def __init__(self, backend: PinnedBackend, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        # The pool httpx built dials through the default backend (which resolves the host
        # again); replace it with one over the pinned backend. One connection, not kept.
        self._pool.close()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=1,
            max_keepalive_connections=0,
            network_backend=backend,
        )


_SSL_CONTEXT: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """One verifying TLS context per process (building one costs milliseconds per attempt)."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context(trust_env=False)
    return _SSL_CONTEXT


@dataclass
class Answer:
    """What came back: a status (None: nothing did), a bounded excerpt, and the error if any.

    ``sent``: whether any of the request may have reached the receiver (False only when
    not one byte of it was handed to a connected socket)."""

    status_code: int | None
    excerpt: str = ""
    error: BaseException | None = None
    connected_to: tuple[str, int] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    sent: bool = True


def post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    addresses: Sequence[IPAddress],
    connect_timeout: float,
    total_timeout: float,
    excerpt_bytes: int = EXCERPT_BYTES,
    ssl_context: ssl.SSLContext | None = None,
) -> Answer:
    """POST ``body`` to ``url`` connecting only to ``addresses``; never raises for the network.

    Transport failures (refused, reset, timeouts, TLS) come back as ``Answer(None, error=…)``.
    """
    deadline = time.monotonic() + total_timeout
    backend = PinnedBackend(addresses, deadline)
    transport = _PinnedTransport(backend, ssl_context or default_ssl_context())
    timeout = httpx.Timeout(total_timeout, connect=min(connect_timeout, total_timeout))
    all_headers = {"User-Agent": USER_AGENT, "Content-Type": "application/json", **headers}
    try:
        with (
            httpx.Client(transport=transport, follow_redirects=False, trust_env=False, timeout=timeout) as client,
            client.stream("POST", url, content=body, headers=all_headers) as response,
        ):
            excerpt = bytearray()
            error: BaseException | None = None
            try:
                for chunk in response.iter_raw():
                    excerpt += chunk
                    if len(excerpt) >= excerpt_bytes:
                        break  # leaving the block closes the connection: the rest is never read
            except httpx.TransportError as exc:
                error = exc  # the status was heard; a broken or slow body only shortens the excerpt
            return Answer(
                response.status_code,
                bytes(excerpt[:excerpt_bytes]).decode("utf-8", "replace"),
                error,
                backend.connected_to,
                {k: v for k, v in list(response.headers.items())[:20]},
            )
    except (httpx.TransportError, httpx.InvalidURL, OSError, ssl.SSLError) as exc:
        return Answer(None, error=exc, connected_to=backend.connected_to, sent=backend.wrote)
