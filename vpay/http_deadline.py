"""One total deadline for a whole HTTP exchange, enforced on the socket.

httpx has no total timeout: its read timeout applies to each read and restarts, so a peer
dripping its status line or headers one byte at a time can hold a call open indefinitely.
:class:`DeadlineStream` wraps an httpcore network stream so that every read, write and TLS
handshake is given only what is left of one deadline (``time.monotonic()``), and fails with
httpcore's own timeout exception once nothing is; httpx maps those to its timeouts as usual.

Used by the rail adapter (a per-thread deadline on a shared, pooled client) and by webhook
delivery (one deadline per attempt, on a one-shot pinned connection): the deadline is a
callable so each can say where its deadline lives.
"""

from __future__ import annotations

import ssl
import time
import typing
from collections.abc import Callable

import httpcore

Deadline = Callable[[], "float | None"]


def remaining(deadline: float | None, timeout: float | None, exc: type[Exception], what: str) -> float | None:
    """``timeout`` cut to what is left before ``deadline``; raises ``exc`` once nothing is.

    ``deadline`` None means unbounded: ``timeout`` is returned as it is.
    """
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise exc(f"{what}'s total timeout elapsed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by what is left of ``deadline()``.

    ``what`` names the exchange in the timeout's message ("the rail call").
    """

    def __init__(self, inner: httpcore.NetworkStream, deadline: Deadline, what: str) -> None:
        self._inner = inner
        self._deadline = deadline
        self._what = what

    def _budget(self, timeout: float | None, exc: type[Exception]) -> float | None:
        return remaining(self._deadline(), timeout, exc, self._what)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        # server_hostname is passed through untouched: SNI and the certificate check stay
        # the caller's (webhooks pin an IP but verify the configured host name).
        inner = self._inner.start_tls(ssl_context, server_hostname, self._budget(timeout, httpcore.ConnectTimeout))
        return DeadlineStream(inner, self._deadline, self._what)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)
