"""What one worker did, counted by disposition, for its closing line and its tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from jobs.runner.decisions import Disposition


@dataclass
class Report:
    """Counts by disposition. ``lost`` > 0 means a lease was taken from a live handler."""

    claimed: int = 0
    finished: int = 0
    retried: int = 0
    rescheduled: int = 0
    deferred: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    lost: int = 0
    released: int = 0
    unrunnable: int = 0  # handed back: this release cannot run it (a rolling deploy)
    unsettled: int = 0  # the settle write itself failed; the lease was handed back later
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, disposition: Disposition, n: int = 1) -> None:
        self.add(disposition.value, n)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items())
