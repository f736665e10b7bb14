"""The backstop scan: every live charge has a poll job, and every live refund its poll.

Not fenced, like the polls: each page is one ``INSERT … ON CONFLICT DO NOTHING`` on the poll
jobs' dedupe keys, which matches nothing on a re-run.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from charges import refund_repository, repository
from jobs import port as queue
from jobs import registry
from jobs.kinds import JobKind
from jobs.port import JobRequest
from jobs.primitives.schema import PayloadSchema
from jobs.runner.context import JobContext
from jobs.runner.outcome import Outcome

logger = logging.getLogger("charges.services.polling")  # the name its log lines always had

SCAN_PAGE = 500
SCAN_MAX_PAGES = 200  # 100k live charges a pass; the next pass continues where it stopped


def _backstop_period() -> float:
    return float(settings.VPAY_CHARGE_BACKSTOP_SECONDS)


@registry.register(
    JobKind.SCAN_LIVE_CHARGES,
    schema=PayloadSchema(),
    timeout_seconds=300.0,
    singleton=registry.Singleton(),
)
def scan_live_charges(ctx: JobContext) -> Outcome:
    """Backstop: every live charge has a poll job (and, at the end of each pass, every live
    refund: ``_restore_refund_polls``). A page of live charges at a time, each
    page one ``INSERT … ON CONFLICT DO NOTHING`` on the poll jobs' dedupe keys, so a charge
    whose job is live (waiting or leased) costs nothing and one whose job was lost (an
    operator's cancel, a letter discarded) gets a new one, due now. A charge whose poll is
    a dead letter awaiting review is the human's (``repository.live_page``).

    A pass scans at most ``SCAN_MAX_PAGES`` pages. Where it got to is the job's checkpoint
    (the last id of each page, stored with the page's heartbeat), and the next run (due at
    once, or the retry after a crash) continues from there; only the end of the table
    clears it, so the next pass starts from the beginning after the backstop period. Ids
    are random, so restarting at the first id every time would leave the same tail of live
    charges unscanned for as long as more than a pass's worth were live."""
    after, restored, pages = ctx.cursor or "", 0, 0
    while True:
        page = repository.live_page(after, SCAN_PAGE)
        if page:
            restored += _restore_page(page, JobKind.POLL_CHARGE, "charge_id", repository)
            after, pages = page[-1][0], pages + 1
        if len(page) < SCAN_PAGE:
            restored += _restore_refund_polls()  # refunds are few: all of them, once a pass
            ctx.checkpoint(None)  # the end of the table: the next pass starts over
            outcome = Outcome.reschedule_in(_backstop_period())
            break
        ctx.checkpoint(after)
        if pages >= SCAN_MAX_PAGES:
            outcome = Outcome.reschedule_in(0, f"{pages} pages scanned; continuing after the last")
            break
    if restored:
        logger.warning(
            "backstop re-enqueued polls for live charges and refunds that had none", extra={"count": restored}
        )
    return outcome


def _restore_refund_polls() -> int:
    """Every live refund has its poll (which is also what sends it): the same
    ``ON CONFLICT DO NOTHING`` on the poll's dedupe key, a page at a time."""
    restored, after = 0, ""
    while page := refund_repository.live_page(after, SCAN_PAGE):
        restored += _restore_page(page, JobKind.POLL_REFUND, "refund_id", refund_repository)
        after = page[-1][0]
        if len(page) < SCAN_PAGE:
            break
    return restored


def _restore_page(page: list[tuple[str, str]], kind: JobKind, field: str, repo) -> int:
    """One page's ``INSERT … ON CONFLICT DO NOTHING`` of polls, and how many of them were
    lost: inserted for a row still live after the insert. A row that settled after the page
    was read had its poll finish meanwhile, so it gets a new one (which finds it settled and
    ends); counting it would report a lost poll where none was."""
    with transaction.atomic():
        inserted = queue.enqueue_many(
            JobRequest(kind, {field: row_id}, dedupe_key=repo.poll_dedupe_key(row_id), tenant=merchant_id)
            for row_id, merchant_id in page
        )
        if not inserted or not queue.adapter().durable:
            return inserted  # the in-process queue's jobs are not rows of jobs to count
        return repo.restored_live([row_id for row_id, _ in page])
