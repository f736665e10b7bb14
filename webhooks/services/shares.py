"""The per-worker share of one endpoint: how many of this process's executors hold an
attempt to it right now (the global cap is counted in the database, under the endpoint's
row lock; this keeps one slow endpoint from holding more than its share of one worker)."""

from __future__ import annotations

import threading
from collections import Counter


class EndpointShares:
    """This process's attempts in flight, per endpoint (the per-worker share; the global
    cap is counted in the database)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._leases: dict[object, str] = {}  # lease token -> endpoint, for release_lease()

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

    def bind(self, token: object, endpoint_id: str) -> None:
        """The slot just acquired for ``endpoint_id`` is held by the attempt with ``token``."""
        with self._lock:
            self._leases[token] = endpoint_id

    def release_lease(self, token: object) -> None:
        """Give back the slot held by the attempt with ``token``; a no-op the second time."""
        with self._lock:
            endpoint_id = self._leases.pop(token, None)
        if endpoint_id is not None:
            self.release(endpoint_id)

    def held(self, endpoint_id: str) -> int:
        with self._lock:
            return self._held[endpoint_id]
