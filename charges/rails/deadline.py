"""The rail exchange's one deadline: every connect, TLS handshake, write and read of a rail
call is given only what is left of it (``charges.rails.adapter`` sets it for each call)."""

from __future__ import annotations

import threading
import time
import typing

import httpcore
import httpx

from vpay.http_deadline import DeadlineStream, remaining

# The deadline of the rail exchange this thread is in (``time.monotonic()``), or None.
# httpx is synchronous here: a request's every socket operation runs on the calling thread,
# whichever pooled connection it uses, so a thread-local is the request's own deadline.
exchange = threading.local()
_WHAT = "the rail call"


def _current_deadline() -> float | None:
    return getattr(exchange, "deadline", None)


def _budget(timeout: float | None, exc: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's exchange; ``exc`` once nothing is."""
    return remaining(_current_deadline(), timeout, exc, _WHAT)


def _bounded(stream: httpcore.NetworkStream) -> httpcore.NetworkStream:
    """A pooled connection whose every read and write gets only what is left of the
    current exchange's deadline: a rail dripping its status line or headers one byte at a
    time cannot stretch a call past it (httpx's read timeout is per read, and restarts)."""
    return DeadlineStream(stream, _current_deadline, _WHAT)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, its connects and streams bounded by the deadline.
    (Name resolution inside the connect is the resolver's, and is not interruptible.)"""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host,
            port,
            timeout=_budget(timeout, httpcore.ConnectTimeout),
            local_address=local_address,
            socket_options=socket_options,
        )
        return _bounded(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Iterable[typing.Any] | None = None
    ) -> httpcore.NetworkStream:  # pragma: no cover - rails are http(s) URLs
        stream = self._inner.connect_unix_socket(
            path, timeout=_budget(timeout, httpcore.ConnectTimeout), socket_options=socket_options
        )
        return _bounded(stream)

    def sleep(self, seconds: float) -> None:  # pragma: no cover - only httpcore's retries (none)
        time.sleep(seconds)


def bound_every_pool(client: httpx.Client) -> None:
    """Dial through :class:`_DeadlineBackend` in every pool the client built (its own and
    any proxy's from the environment), keeping httpx's transports, TLS and proxy handling."""
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            # A future httpx/httpcore moved these: refuse to build an adapter without its bound.
            raise RuntimeError("cannot bound the rail exchange: httpx's connection pool is not where expected")
        pool._network_backend = _DeadlineBackend()
