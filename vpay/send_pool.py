"""Threads that only wait on the network: the sends a batch makes at once (a deliver job's
carried attempts, a poll's carried status reads). One pool per use per process, created at
first use (after the supervisor forked the worker), sized by its caller for every executor's
batch at once, so a send never queues behind another batch's slow peer. Its caller reads
before and writes after; a send that opens a connection anyway has it closed when it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from django.db import connections


class SendPool:
    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, size: int, fn: Callable, /, *args, **kwargs) -> Future:
        """``fn(*args, **kwargs)`` on a send thread; ``size`` bounds the pool when it is made."""
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=max(size, 1), thread_name_prefix=self.name)
        return self._pool.submit(_closing, fn, *args, **kwargs)


def _closing(fn: Callable, /, *args, **kwargs):
    """``fn`` on a send thread; any database connection it opened is closed after it (a
    rare path may write, as the webhook send's alert about a changed body does), so the
    pool's threads never hold connections between sends."""
    try:
        return fn(*args, **kwargs)
    finally:
        for conn in connections.all(initialized_only=True):
            conn.close()
