"""``python manage.py apikeys``: a merchant's secret keys and OAuth clients from the shell.

::

    apikeys list   ACCT_ID
    apikeys roll   ACCT_ID --reason TEXT [--overlap SECONDS]   # prints the new key once, on stdout
    apikeys revoke KEY_ID  --reason TEXT                       # the key stops now
    apikeys revoke-client CLIENT_ID --reason TEXT              # the client and its tokens stop now

A roll issues a new key; the keys that work now keep working for the overlap
(``VPAY_API_KEY_ROLL_OVERLAP_SECONDS``, 24 h; 0 stops them at once), then stop, by the
database clock. Every change is logged (never a key) with its reason.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Case, Value, When
from django.db.models.functions import Now

from merchants import services
from merchants.clients import oauth_client_revoke
from merchants.models import Merchant, OAuthClient
from vpay.errors import DomainError


class Command(BaseCommand):
    help = "List, roll and revoke a merchant's secret keys; revoke OAuth clients."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="A merchant's keys (by last four) and OAuth clients.")
        listing.add_argument("merchant")
        roll = sub.add_parser("roll", help="Issue a new key; the current ones stop after the overlap.")
        roll.add_argument("merchant")
        roll.add_argument("--reason", required=True)
        roll.add_argument("--overlap", type=int, default=None, help="Seconds the old keys keep working (default 24 h).")
        revoke = sub.add_parser("revoke", help="Stop one key now.")
        revoke.add_argument("key", type=int, help="The key's id (apikeys list).")
        revoke.add_argument("--reason", required=True)
        revoke_client = sub.add_parser("revoke-client", help="Stop an OAuth client and its tokens now.")
        revoke_client.add_argument("client")
        revoke_client.add_argument("--reason", required=True)

    def handle(self, *args, **options):
        try:
            getattr(self, "_" + options["action"].replace("-", "_"))(options)
        except DomainError as exc:
            raise CommandError(exc.message) from None

    def _list(self, options):
        merchant = Merchant.objects.filter(id=options["merchant"]).first()
        if merchant is None:
            raise CommandError(f"No such merchant: {options['merchant']!r}.")
        # Whether each key works now is the database's answer (its clock), not this host's.
        working = Case(
            When(revoked_at__isnull=False, then=Value(False)),
            When(expires_at__lte=Now(), then=Value(False)),
            default=Value(True),
        )
        keys = merchant.api_keys.annotate(working=working).order_by("created_at")
        for key in keys:
            state = "revoked" if key.revoked_at else ("active" if key.working else "expired")
            until = f" until {key.expires_at:%Y-%m-%d %H:%M:%S %Z}" if key.expires_at and key.working else ""
            self.stdout.write(f"key {key.pk}\tsk_…{key.last4}\t{state}{until}\tcreated {key.created_at:%Y-%m-%d %H:%M}")
        for client in OAuthClient.objects.filter(merchant=merchant).order_by("created_at"):
            state = "revoked" if client.revoked_at else "active"
            self.stdout.write(f"client {client.id}\t{client.name}\t{state}")

    def _roll(self, options):
        overlap = options["overlap"]
        if overlap is None:
            overlap = settings.VPAY_API_KEY_ROLL_OVERLAP_SECONDS
        new, key = services.api_key_roll(
            merchant_id=options["merchant"], overlap_seconds=overlap, reason=options["reason"]
        )
        self.stderr.write(
            f"Issued key {new.pk} (sk_…{new.last4}); the previous keys stop in {overlap} s. Shown once; store it now:"
        )
        self.stdout.write(key)

    def _revoke(self, options):
        key = services.api_key_revoke(key_id=options["key"], reason=options["reason"])
        self.stdout.write(f"Revoked key {key.pk} (sk_…{key.last4}) of {key.merchant_id}.")

    def _revoke_client(self, options):
        client = oauth_client_revoke(client_id=options["client"], reason=options["reason"])
        self.stdout.write(f"Revoked OAuth client {client.id} of {client.merchant_id}.")
