"""The per-worker shares: how many of this process's executors hold an attempt to one
endpoint, and to one merchant's endpoints, right now (the global per-endpoint cap is
counted in the database, under the endpoint's row lock; these keep one slow endpoint, and
one merchant with many slow endpoints, from holding more than their share of one worker)."""

from __future__ import annotations

import threading
from collections import Counter


class EndpointShares:
    """This process's attempts in flight, per endpoint (the per-worker share; the global
    cap is counted in the database)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._leases: dict[object, tuple[str, ...]] = {}  # lease token -> its keys, for release_lease()

    def acquire(self, endpoint_id: str, share: int) -> bool:
        with self._lock:
            if self._held[endpoint_id] >= share:
                return False
            self._held[endpoint_id] += 1
            return True

    def release(self, endpoint_id: str) -> None:
        with self._lock:
            self._held[endpoint_id] -= 1
            if self._held[endpoint_id] <= 0:
                del self._held[endpoint_id]

    def bind(self, token: object, *keys: str) -> None:
        """The slots just acquired for ``keys`` (an endpoint, its merchant) are held by the
        attempt with ``token``."""
        with self._lock:
            self._leases[token] = keys

    def release_lease(self, token: object) -> None:
        """Give back the slots held by the attempt with ``token``; a no-op the second time."""
        with self._lock:
            keys = self._leases.pop(token, ())
        for key in keys:
            self.release(key)

    def held(self, endpoint_id: str) -> int:
        with self._lock:
            return self._held[endpoint_id]
