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
    """Print the operation's progress line whenever it changes, until it is done, failed or
    cancelled (or ``timeout`` seconds passed: CommandError)."""
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
    """After the end: the refused and dead-lettered items with why, and a non-zero exit if
    anything was refused or dead-lettered, or the operation was cancelled."""
    if progress.state == BulkOperationState.FAILED:
        raise CommandError(f"bulk operation #{progress.id} failed: {progress.error}")
    unsuccessful = progress.refused + progress.failed
    items = BulkItem.objects.filter(
        operation_id=progress.id, state__in=[BulkItemState.REFUSED, BulkItemState.FAILED]
    ).order_by("item_id")
    for item_id, note in items.values_list("item_id", "note")[:REFUSALS_SHOWN]:
        stderr.write(f"#{item_id}: {note}")
    if unsuccessful > REFUSALS_SHOWN:
        stderr.write(f"… and {unsuccessful - REFUSALS_SHOWN} more (see the admin: Job queue, Bulk operations)")
    if progress.state == BulkOperationState.CANCELLED:
        raise CommandError(
            f"bulk operation #{progress.id} was cancelled ({progress.skipped} skipped): {progress.error}"
        )
    if progress.failed:
        raise CommandError(f"{verb}: {progress.refused} of {progress.matched} refused, {progress.failed} dead-lettered")
    if progress.refused:
        raise CommandError(f"{verb}: {progress.refused} of {progress.matched} refused")
