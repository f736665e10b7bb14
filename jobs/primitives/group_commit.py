"""Group commit: the same short database step asked for by many executor threads at once,
run for all of them in one batch (one transaction, a few multi-row statements).

Every thread that calls :meth:`GroupCommit.submit` waits for its own answer. The first
caller to find no batch running becomes the *leader*: it takes its own request and those
waiting (up to ``max_batch``), runs them together on its own database connection, hands
each waiter its answer and returns its own. A caller that finds a batch running waits;
when that batch ends, the first waiter still unanswered leads the next, with everything
that queued meanwhile. So a request never waits for a timer: alone, it runs at once, as a
call would; under load, requests queue while a batch runs and share the next one, and the
batches grow with the load (PostgreSQL's own group commit, and pgqueuer's buffered acks,
work the same way, without their flush timer).

Failure isolation: when a batch raises, each of its requests is run again alone, by the
thread that asked for it, on that thread's own connection: one bad request fails only
itself (the fan-out's page-then-one-by-one discipline), and a leader's broken connection
fails no other thread's request. A batch function is therefore written so that running it
again after a rollback is safe: it runs in a transaction of its own and decides
everything under the row locks it takes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_UNSET = object()


@dataclass(eq=False)
class _Slot(Generic[T]):
    request: T
    result: object = _UNSET
    error: BaseException | None = None
    done: bool = field(default=False)
    alone: bool = False  # its batch failed: run it again on its own


class GroupCommit(Generic[T, R]):
    """Runs ``run_batch`` over the requests of concurrent callers (see the module docstring).

    ``run_batch(requests)`` returns one answer per request, in order, or raises."""

    def __init__(self, run_batch: Callable[[Sequence[T]], Sequence[R]], *, max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._waiting: list[_Slot[T]] = []
        self._leading = False
        self.batches = 0  # batches run (a retried batch's single runs included): for tests and benchmarks
        self.requests = 0

    def submit(self, request: T) -> R:
        """``request``'s answer, once the batch it rode in has run (raises what it raised)."""
        slot: _Slot[T] = _Slot(request)
        with self._cv:
            self._waiting.append(slot)
            while not slot.done and self._leading:
                self._cv.wait()
            if not slot.done:
                # No batch running and this one unanswered: lead the next, this request first.
                self._leading = True
                self._waiting.remove(slot)
                batch = [slot, *self._waiting[: self.max_batch - 1]]
                del self._waiting[: self.max_batch - 1]
        if not slot.done:
            try:
                self._lead(batch)
            finally:
                with self._cv:
                    self._leading = False
                    self._cv.notify_all()
        if slot.alone:
            self._count(1)
            (result,) = self._run_batch([request])
            return result
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _lead(self, batch: list[_Slot[T]]) -> None:
        try:
            self._answer(batch, self._run_batch([s.request for s in batch]))
        except BaseException as exc:  # noqa: BLE001 - handed to the callers, who raise it
            if len(batch) == 1 or not isinstance(exc, Exception):
                for slot in batch:
                    slot.error, slot.done = exc, True
                return
            for slot in batch:  # each runs again alone, in its own thread (the module docstring)
                slot.alone, slot.done = True, True
        finally:
            for slot in batch:  # an answer missing (a batch function's bug) is an error, not a hang
                if not slot.done:
                    slot.error, slot.done = RuntimeError("group commit: no answer for this request"), True

    def _count(self, requests: int) -> None:
        with self._cv:
            self.batches += 1
            self.requests += requests

    def _answer(self, batch: list[_Slot[T]], results: Sequence[R]) -> None:
        self._count(len(batch))
        if len(results) != len(batch):
            raise RuntimeError(f"group commit: {len(results)} answers for {len(batch)} requests")
        for slot, result in zip(batch, results, strict=True):
            slot.result, slot.done = result, True
