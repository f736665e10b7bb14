"""Sweeping due rows in keyset pages, one transaction per row, failures isolated.

The shape every housekeeping sweep shares (checkout expiry, idle customers, …): read a
page of candidate keys *after* the last key seen, retire each in its own transaction, log a
row that fails at WARN (by id) and go on. Keyset paging, not ``OFFSET`` and not "the first
page again": a row that failed is not read again in the same pass, so one poisoned row
cannot become a hot loop, and the rows behind it are reached.

The keyset is the job's checkpoint (``jobs.primitives.checkpoints``): each page's last key is stored
with the page's heartbeat, and a pass that stopped (a crash, its budget, a reschedule)
continues after it; only the end of the table clears it, so the next pass starts over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from jobs.runner.context import JobContext
from vpay.errors import error_chain

logger = logging.getLogger(__name__)

PAGE_SIZE = 100


class PassResult(NamedTuple):
    retired: int
    failed: int
    skipped: int
    more: bool
    """A full page made progress when the pass stopped: run again at once, not in an hour."""


def sweep_in_pages(
    ctx: JobContext,
    *,
    label: str,
    read_page: Callable[[tuple | None, int], Sequence[tuple]],
    retire: Callable[[tuple], bool],
    page_size: int = PAGE_SIZE,
    budget_seconds: float | None = None,
) -> PassResult:
    """Retire due rows page by page until a page comes back short or the budget is spent.

    ``read_page(after, limit)`` returns keys ordered by the keyset, strictly after ``after``
    (``None`` for the first page); the last element of each key is the row's id, used in
    log lines. ``retire(key)`` runs one row's transaction and answers whether it changed
    anything (``False``: the guard inside its statement no longer held; not a failure).
    The budget defaults to half the job's remaining time, so the pass ends long before
    its lease does. The pass starts after ``ctx.cursor`` (a key as JSON read it back:
    a datetime as its ISO text, which PostgreSQL compares as the column's type).
    """
    budget = ctx.remaining() / 2 if budget_seconds is None else budget_seconds
    deadline = time.monotonic() + budget
    retired = failed = skipped = 0
    after: tuple | None = tuple(ctx.cursor) if ctx.cursor else None
    while True:
        page = read_page(after, page_size)
        progress = False
        for key in page:
            try:
                changed = retire(key)
            except Exception as exc:  # noqa: BLE001 - one row's failure must not stop the page
                failed += 1
                logger.warning(
                    f"{label}: a row failed and was skipped",
                    extra={"id": str(key[-1]), "error": error_chain(exc, 300)},
                )
                continue
            if changed:
                retired += 1
                progress = True
            else:
                skipped += 1
        full = len(page) == page_size
        if not full:
            ctx.checkpoint(None)  # the end of the table: the next pass starts over
            return PassResult(retired, failed, skipped, more=False)
        after = tuple(page[-1])
        ctx.checkpoint(list(after))
        if time.monotonic() >= deadline:
            return PassResult(retired, failed, skipped, more=progress)


def delete_in_pages(
    ctx: JobContext,
    *,
    read_page: Callable[[tuple | None, int], Sequence[tuple]],
    delete_page: Callable[[list], int],
    page_size: int = 1000,
    budget_seconds: float | None = None,
) -> PassResult:
    """Retention's shape of :func:`sweep_in_pages`: a keyset page of candidates, then one
    guarded DELETE for the whole page (its own transaction), so millions of old rows cost
    a statement per thousand, not a transaction each.

    ``read_page`` is as in :func:`sweep_in_pages` (keys in keyset order, each ending with
    the row's id). ``delete_page(ids)`` deletes those of ``ids`` that its own WHERE still
    admits and returns how many: the read is only a candidate list, so the statement MUST
    repeat every guard (age on the database clock, "nothing live depends on it") — a row
    that changed since the read is re-checked there and kept. A page that fails is a
    failure of the whole page: raised, for the sweep step to report; the checkpoint still
    holds the key before it, so the next pass retries it.
    """
    budget = ctx.remaining() / 2 if budget_seconds is None else budget_seconds
    deadline = time.monotonic() + budget
    deleted = skipped = 0
    after: tuple | None = tuple(ctx.cursor) if ctx.cursor else None
    while True:
        page = read_page(after, page_size)
        gone = delete_page([key[-1] for key in page]) if page else 0
        deleted += gone
        skipped += len(page) - gone
        if len(page) < page_size:
            ctx.checkpoint(None)  # the end of the table: the next pass starts over
            return PassResult(deleted, 0, skipped, more=False)
        after = tuple(page[-1])
        ctx.checkpoint(list(after))
        if time.monotonic() >= deadline:
            return PassResult(deleted, 0, skipped, more=gone > 0)
