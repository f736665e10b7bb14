"""``python manage.py webhooks resend --since … [--until …]``: resend every delivery that
failed in a window (after an outage), as one bulk operation the queue expands."""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError

from jobs.bulk_models import BulkOperationKind
from jobs.management.commands.deadletters import parse_since
from jobs.operator import bulk_watch
from jobs.services import bulk
from webhooks.bulk_resend import FAILED_STATES


class Command(BaseCommand):
    help = "Webhook operations from a shell: resend deliveries that failed in a time window."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True, metavar="resend")
        resend = sub.add_parser("resend", help="Resend every delivery that failed in a window, as one bulk operation.")
        resend.add_argument("--since", required=True, help="Window start: a duration back (30m, 12h, 7d) or ISO-8601.")
        resend.add_argument("--until", help="Window end (default: now): a duration back or ISO-8601.")
        resend.add_argument(
            "--state", action="append", choices=FAILED_STATES, default=[], help="Only this failed state (repeatable)."
        )
        resend.add_argument("--endpoint", action="append", default=[], help="Only this endpoint id (repeatable).")
        resend.add_argument("--actor", default="", help="Who is acting (default shell:<login name>).")
        resend.add_argument("--user", default="", help="Act as this Django user (its History entries are written).")
        resend.add_argument("--wait", action="store_true", help="Print the operation's progress until it is done.")
        resend.add_argument("--timeout", type=float, default=None, help="With --wait: give up after these seconds.")

    def handle(self, *args, verb: str, **options):
        since_seconds, since_at = parse_since(options["since"])
        until_seconds, until_at = parse_since(options["until"]) if options["until"] else (None, None)
        user = None
        if options["user"]:
            from django.contrib.auth import get_user_model

            model = get_user_model()
            user = model.objects.filter(**{model.USERNAME_FIELD: options["user"]}).first()
            if user is None:
                raise CommandError(f"--user {options['user']!r}: no such user")
        actor = options["actor"].strip() or (user.get_username() if user else f"shell:{_login_name()}")
        try:
            operation_id = bulk.bulk_operation_submit(
                operation=BulkOperationKind.RESEND_DELIVERIES,
                filter={
                    "states": options["state"] or None,
                    "since_seconds": since_seconds,
                    "since_at": since_at.isoformat() if since_at else None,
                    "until_seconds": until_seconds,
                    "until_at": until_at.isoformat() if until_at else None,
                    "endpoints": options["endpoint"] or None,
                },
                actor=actor,
                user_id=user.pk if user else None,
            )
        except bulk.BulkRefused as exc:
            raise CommandError(f"resend: {exc}") from None
        self.stdout.write(f"submitted bulk operation #{operation_id} (resend_deliveries)")
        if options["wait"]:
            progress = bulk_watch.watch(operation_id, self.stdout, timeout=options["timeout"])
            bulk_watch.report(progress, self.stderr, "resend")


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
