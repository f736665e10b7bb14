"""Following a bulk operation from a shell: one line each time its progress changes."""

from __future__ import annotations

import time

from django.core.management.base import CommandError

from jobs.bulk_models import BulkItem, BulkItemState, BulkOperationState
from jobs.services.bulk import Progress, bulk_operation_progress

# How often the shell reads the envelope (one primary-key SELECT).
POLL_SECONDS = 0.5
REFUSALS_SHOWN = 20


def watch(operation_id: int, stdout, *, timeout: float | None = None, poll: float = POLL_SECONDS) -> Progress:
    """Print the operation's progress line whenever it changes, until it is done or failed
    (or ``timeout`` seconds passed: CommandError)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        progress = bulk_operation_progress(operation_id)
        if progress is None:
            raise CommandError(f"bulk operation #{operation_id} does not exist")
        if progress != last:
            stdout.write(progress.line())
            stdout.flush()
            last = progress
        if progress.finished:
            return progress
        if deadline is not None and time.monotonic() >= deadline:
            raise CommandError(f"bulk operation #{operation_id} still {progress.state} after {timeout:g} s")
        time.sleep(poll)


def report(progress: Progress, stderr, verb: str) -> None:
    """After the end: the refused items with why, and a non-zero exit if anything was refused."""
    if progress.state == BulkOperationState.FAILED:
        raise CommandError(f"bulk operation #{progress.id} failed: {progress.error}")
    refused = BulkItem.objects.filter(operation_id=progress.id, state=BulkItemState.REFUSED).order_by("item_id")
    for item_id, note in refused.values_list("item_id", "note")[:REFUSALS_SHOWN]:
        stderr.write(f"#{item_id}: {note}")
    if progress.refused > REFUSALS_SHOWN:
        stderr.write(f"… and {progress.refused - REFUSALS_SHOWN} more (see the admin: Job queue, Bulk operations)")
    if progress.refused:
        raise CommandError(f"{verb}: {progress.refused} of {progress.matched} refused")
