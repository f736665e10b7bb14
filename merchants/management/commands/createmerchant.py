"""``python manage.py createmerchant NAME``: a merchant and its secret key.

The key goes to stdout alone on its line (``KEY=$(… createmerchant Acme)`` works); it is
shown this once and stored only as a digest.
"""

from django.core.management.base import BaseCommand, CommandError

from merchants.services import merchant_create
from vpay.errors import InvalidInput


class Command(BaseCommand):
    help = "Create a merchant and print its secret API key (sk_…) once."

    def add_arguments(self, parser):
        parser.add_argument("name", help="The merchant's display name (1 to 200 characters).")

    def handle(self, *args, **options):
        try:
            merchant, key = merchant_create(name=options["name"])
        except InvalidInput as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"Created merchant {merchant.id}. Its secret key is shown once; store it now:")
        self.stdout.write(key)
