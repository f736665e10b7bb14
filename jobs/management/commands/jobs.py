"""``python manage.py jobs cancel ID --reason TEXT [--user NAME] [--wait SECONDS]``.

The command parses; :func:`jobs.services.cancels.job_cancel` acts, with the same guards
as the admin's *Cancel*. Exit status 0 when the job was cancelled or asked to stop, and a
clear error (non-zero) for a malformed or unknown id, a blank reason, or a kind that is
not cancellable (the refusal says why).
"""

from __future__ import annotations

import time
import uuid

from django.core.management.base import BaseCommand, CommandError

from jobs.management.commands.deadletters import _login_name, _user
from jobs.models import DeadLetter, DeadLetterCause, Job
from jobs.services import cancels

WAIT_POLL_SECONDS = 0.2


class Command(BaseCommand):
    help = "Act on live jobs from a shell: cancel one, waiting or running."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True, metavar="cancel")
        cancel = sub.add_parser("cancel", help="Cancel a job: at once if waiting, at its next heartbeat if running.")
        cancel.add_argument("job_id", help="The job's job_id (a UUID; for a task, its Tasks result id).")
        cancel.add_argument("--reason", required=True, help="Why (required, recorded with the cancel).")
        cancel.add_argument(
            "--user",
            default="",
            help="Act as this Django user: recorded as who asked, and in the admin log (default shell:<login name>).",
        )
        cancel.add_argument(
            "--wait",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="For a running job, wait up to this long for its end and say which it was (default: do not wait).",
        )

    def handle(self, *args, verb: str, **options):
        try:
            job_id = uuid.UUID(options["job_id"].strip())
        except ValueError:
            raise CommandError(f"{options['job_id']!r} is not a job id (a UUID such as a Tasks result id)") from None
        if options["wait"] < 0:
            raise CommandError("--wait must not be negative")
        user = _user(options["user"]) if options["user"] else None
        actor = user.get_username() if user else f"shell:{_login_name()}"
        try:
            done = cancels.job_cancel(
                job_id=job_id, actor=actor, reason=options["reason"], user_id=user.pk if user else None
            )
        except cancels.CancelRefused as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(f"job {job_id}: {done.message}")
        if not done.ended and options["wait"] > 0:
            self.stdout.write(f"job {job_id}: {_wait_for_end(job_id, options['wait'])}")


def _wait_for_end(job_id: uuid.UUID, seconds: float) -> str:
    """How a running job ended after its cancel request, or that it is still running."""
    deadline = time.monotonic() + seconds
    while Job.objects.filter(job_id=job_id).exists():
        if time.monotonic() >= deadline:
            return f"still running after {seconds:g} s; the request stands"
        time.sleep(WAIT_POLL_SECONDS)
    letter = DeadLetter.objects.filter(job_id=job_id).order_by("-created_at").first()
    if letter is not None and letter.cause == DeadLetterCause.CANCELLED:
        return f"cancelled: dead letter #{letter.pk}"
    if letter is not None:
        return f"ended first as dead letter #{letter.pk} ({letter.cause}); the request was overtaken"
    return "finished before it saw the request: its answer stands; the request was overtaken"
