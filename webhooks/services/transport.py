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
* the answer's body is read up to ``excerpt_bytes``; a longer one closes the connection, so
  an endless body costs one buffer, never the worker;
* whether any of the request may have reached the receiver (:attr:`Answer.sent`): a
  refused connection, a failed TLS handshake or a budget spent before the first write
  sent nothing, and the delivery's digest is only ever of a body that may have left.

Keep-alive that keeps the pin. A connection is kept only after an answer read to its end,
in a per-process pool keyed by (vetted address, host, port, scheme): the address it was
dialled to, and the name TLS checked. An attempt vets its host afresh (the caller resolves
it every time) and reuses only a connection whose address is among the addresses this
resolution returned, for the same host, port and scheme; so a host whose DNS now answers
elsewhere never reaches the old address over an old connection, and a connection is never
lent to another host that shares its address (SNI and the certificate were that host's).
A kept connection that died meanwhile is re-dialled, to that same vetted address only.
"""

from __future__ import annotations

import ipaddress
import ssl
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpcore
import httpx

from vpay.http_deadline import DeadlineStream
from webhooks.ssrf import IPAddress

USER_AGENT = "vpay-webhooks/1"
EXCERPT_BYTES = 4096
# An idle kept connection older than this is closed rather than reused: under the shortest
# common receiver keep-alive timeout (Node's 5 s), so a reused connection is rarely one the
# receiver is closing at that moment (and when it is, post() sends once more).
KEEPALIVE_EXPIRY_SECONDS = 4.0


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

    def __init__(self, backend: PinnedBackend, ssl_context: ssl.SSLContext, *, keep: bool) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        # The pool httpx built dials through the default backend (which resolves the host
        # again); replace it with one over the pinned backend: one connection, kept open
        # after a complete answer only when ``keep`` (the caller then pools this transport).
        self._pool.close()
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=1,
            max_keepalive_connections=1 if keep else 0,
            keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
            network_backend=backend,
        )

    def idle_connections(self) -> int:
        """Connections this transport holds open and idle (after a complete answer)."""
        return sum(1 for c in self._pool.connections if c.is_idle())


PoolKey = tuple[str, str, int, str]  # (vetted address, host, port, scheme)


@dataclass
class _Kept:
    backend: PinnedBackend
    transport: _PinnedTransport

    def close(self) -> None:
        self.transport.close()


class KeptConnections:
    """Idle keep-alive connections, one per entry, at most ``limit`` across every key (the
    least recently used is closed first). Thread-safe: an entry is taken out while one
    attempt uses it and given back after a complete answer."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._idle: OrderedDict[tuple[PoolKey, int], _Kept] = OrderedDict()
        self._serial = 0

    def take(self, keys: Sequence[PoolKey]) -> tuple[PoolKey, _Kept] | None:
        """An idle connection for the first of ``keys`` that has one (most recent first)."""
        with self._lock:
            for key in keys:
                for entry_key in reversed(self._idle):
                    if entry_key[0] == key:
                        return key, self._idle.pop(entry_key)
        return None

    def give(self, key: PoolKey, kept: _Kept) -> None:
        evicted = []
        with self._lock:
            self._serial += 1
            self._idle[(key, self._serial)] = kept
            while len(self._idle) > self.limit:
                evicted.append(self._idle.popitem(last=False)[1])
        for old in evicted:
            old.close()

    def close_all(self) -> None:
        with self._lock:
            entries, self._idle = list(self._idle.values()), OrderedDict()
        for kept in entries:
            kept.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._idle)


_KEPT: KeptConnections | None = None
_KEPT_LOCK = threading.Lock()


def kept_connections() -> KeptConnections:
    """This process's kept connections, sized by ``VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS``."""
    global _KEPT
    from django.conf import settings

    limit = settings.VPAY_WEBHOOK_KEEPALIVE_CONNECTIONS
    with _KEPT_LOCK:
        if _KEPT is None or _KEPT.limit != limit:
            if _KEPT is not None:
                _KEPT.close_all()
            _KEPT = KeptConnections(limit)
        return _KEPT


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
    keep: KeptConnections | None = None,
) -> Answer:
    """POST ``body`` to ``url`` connecting only to ``addresses``; never raises for the network.

    Transport failures (refused, reset, timeouts, TLS) come back as ``Answer(None, error=…)``.
    With ``keep``, a connection kept from an earlier attempt to one of ``addresses`` (same
    host, port and scheme) is reused, and this one is kept after a complete answer.

    A kept connection the receiver closed as it was reused (its idle timeout fired while
    the request went out: the answer is a disconnect or a reset before any status) is the
    keep-alive's own failure, not the receiver's: the request goes once more over a fresh
    connection, within the same deadline. The receiver never answered the first, so at
    worst it gets the body twice under one event id, which delivery allows (at least once).
    """
    if ssl_context is not None:
        keep = None  # a caller's own TLS context: its connections are not the pool's
    deadline = time.monotonic() + total_timeout
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return Answer(None, error=exc, sent=False)
    port = target.port or (443 if target.scheme == "https" else 80)
    keys = [(str(address), target.host, port, target.scheme) for address in addresses]
    taken = keep.take(keys) if keep is not None else None
    if taken is not None:
        key, kept = taken
        # Re-armed for this attempt: its deadline, and, should the kept connection have died,
        # a re-dial to this key's address only (vetted by this attempt's resolution).
        kept.backend.addresses = [ipaddress.ip_address(key[0])]  # the key holds it as text
        kept.backend.deadline = deadline
        kept.backend.wrote = False
    else:
        kept = _fresh(addresses, deadline, ssl_context, keep is not None)
    timeout = httpx.Timeout(total_timeout, connect=min(connect_timeout, total_timeout))
    all_headers = {
        "User-Agent": USER_AGENT,
        "Content-Type": "application/json",
        "Accept-Encoding": "identity",  # the excerpt is stored as read: never compressed bytes
        **headers,
    }
    # Straight to the transport, not through an httpx.Client: a client's cookie jar, auth,
    # redirect and default-header handling are nothing a webhook POST wants (no redirects
    # are followed: a 3xx is an answer) and cost a third of an attempt's CPU. The request's
    # timeouts ride in its extensions, as a client would put them there.
    request = httpx.Request(
        "POST", target, content=body, headers=all_headers, extensions={"timeout": timeout.as_dict()}
    )
    try:
        answer, reusable = _exchange(kept, request, excerpt_bytes)
        if taken is not None and answer.status_code is None and isinstance(answer.error, _CLOSED_WHILE_IDLE):
            kept.close()
            kept = _fresh(addresses, deadline, ssl_context, True)
            answer, reusable = _exchange(kept, request, excerpt_bytes)
            answer.sent = True  # the first send may have reached the receiver
    except BaseException:
        kept.close()
        raise
    connected_to = kept.backend.connected_to
    if keep is not None and reusable and connected_to and kept.transport.idle_connections():
        keep.give((connected_to[0], target.host, port, target.scheme), kept)
    else:
        kept.close()
    return answer


# What a kept connection the receiver closed while it sat idle looks like when reused: the
# server's FIN or RST arrives instead of a status line.
_CLOSED_WHILE_IDLE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _fresh(addresses: Sequence[IPAddress], deadline: float, ssl_context: ssl.SSLContext | None, keep: bool) -> _Kept:
    backend = PinnedBackend(addresses, deadline)
    return _Kept(backend, _PinnedTransport(backend, ssl_context or default_ssl_context(), keep=keep))


def _exchange(kept: _Kept, request: httpx.Request, excerpt_bytes: int) -> tuple[Answer, bool]:
    """One request over ``kept``: the answer, and whether the connection may be kept (the
    answer was read to its end)."""
    backend = kept.backend
    try:
        response = kept.transport.handle_request(request)
        stream = typing.cast(httpx.SyncByteStream, response.stream)  # a sync transport's
        try:
            excerpt = bytearray()
            error: BaseException | None = None
            complete = False
            try:
                for chunk in stream:
                    excerpt += chunk
                    if len(excerpt) >= excerpt_bytes:
                        break  # closing the stream closes the connection: the rest is never read
                else:
                    complete = True
            except httpx.TransportError as exc:
                error = exc  # the status was heard; a broken or slow body only shortens the excerpt
            answer = Answer(
                response.status_code,
                bytes(excerpt[:excerpt_bytes]).decode("utf-8", "replace"),
                error,
                backend.connected_to,
                {k: v for k, v in list(response.headers.items())[:20]},
            )
        finally:
            stream.close()
        return answer, complete and error is None and backend.connected_to is not None
    except (httpx.TransportError, httpx.InvalidURL, OSError, ssl.SSLError) as exc:
        return Answer(None, error=exc, connected_to=backend.connected_to, sent=backend.wrote), False
