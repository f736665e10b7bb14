"""``python manage.py reseal [--fernet-only]``: re-seal every sealed value under the first
key of ``VPAY_SECRETS_KEY``, bound to its row (``vpay/reseal.py``)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from vpay.reseal import TARGETS, reseal_target


class Command(BaseCommand):
    help = "Re-seal sealed values under the current key, each bound to its row (after a key rotation or an upgrade)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--fernet-only",
            action="store_true",
            help="Only values still in the earlier, unbound format (Fernet).",
        )

    def handle(self, *args, fernet_only: bool = False, **options):
        unreadable = 0
        for target in TARGETS:
            counts = reseal_target(target, fernet_only=fernet_only)
            unreadable += counts.unreadable
            self.stdout.write(
                f"{target.table}.{target.column}: {counts.resealed} re-sealed, {counts.unreadable} unreadable"
            )
        if unreadable:
            self.stderr.write(
                f"{unreadable} values open with no configured key for their row: left as they are"
                " (a key removed too early, or a value moved from another row)"
            )
