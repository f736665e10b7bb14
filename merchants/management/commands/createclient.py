"""``python manage.py createclient ACCT_ID --name NAME --public-key FILE``: register an OAuth
client for a merchant.

FILE is the client's PEM public key (``-`` reads stdin); vpay never holds the private key.
The client id (``cli_…``) goes to stdout alone on its line; it is not a secret. The client
signs assertions with its private key and exchanges them at ``POST /v1/oauth/token``
(docs/api.md, "OAuth clients").
"""

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from merchants.clients import oauth_client_register
from vpay.errors import DomainError


class Command(BaseCommand):
    help = "Register an OAuth client (private_key_jwt) for a merchant and print its client id."

    def add_arguments(self, parser):
        parser.add_argument("merchant", help="The merchant's id (acct_…).")
        parser.add_argument("--name", required=True, help="A name operators recognise (1 to 200 characters).")
        parser.add_argument(
            "--public-key", required=True, help="PEM public key file (RSA ≥ 2048, EC P-256, Ed25519); - for stdin."
        )

    def handle(self, *args, **options):
        source = options["public_key"]
        try:
            pem = sys.stdin.read() if source == "-" else Path(source).read_text()
        except (OSError, UnicodeError) as exc:
            raise CommandError(f"cannot read the public key: {type(exc).__name__}") from None
        try:
            client = oauth_client_register(merchant_id=options["merchant"], name=options["name"], public_key=pem)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Registered OAuth client for {client.merchant_id}; its token URL is /v1/oauth/token:")
        self.stdout.write(client.id)
