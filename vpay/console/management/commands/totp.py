"""``python manage.py totp add|list|remove``: an operator's TOTP device for the console.

``add <username>`` creates a confirmed device and prints, once, its ``otpauth://`` URL and
key for an authenticator app (whoever runs it on a vpay host is trusted with the console
anyway; the key is never logged). Live mode lets a staff user into the admin only with a
token from such a device (``vpay/console/site.py``).
"""

from __future__ import annotations

import base64

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django_otp.plugins.otp_totp.models import TOTPDevice


class Command(BaseCommand):
    help = "Enrol, list or remove an operator's TOTP device (the console's second factor in live mode)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Create a TOTP device and print its otpauth:// URL once.")
        add.add_argument("username")
        add.add_argument("--name", default="authenticator", help="The device's name (shown at login).")
        add.add_argument("--replace", action="store_true", help="Remove the user's other TOTP devices first.")
        sub.add_parser("list", help="Users and their TOTP devices (names only).")
        remove = sub.add_parser("remove", help="Remove every TOTP device of a user.")
        remove.add_argument("username")

    def handle(self, *args, action: str, **options):
        if action == "list":
            for device in TOTPDevice.objects.select_related("user").order_by("user__username", "id"):
                state = "confirmed" if device.confirmed else "unconfirmed"
                self.stdout.write(f"{device.user.get_username()}\t{device.name}\t{state}")
            return
        user = self._user(options["username"])
        if action == "remove":
            deleted, _ = TOTPDevice.objects.filter(user=user).delete()
            self.stdout.write(f"removed {deleted} TOTP device(s) of {user.get_username()}")
            return
        with transaction.atomic():
            if options["replace"]:
                TOTPDevice.objects.filter(user=user).delete()
            device = TOTPDevice.objects.create(user=user, name=options["name"], confirmed=True)
        if not user.is_staff:
            self.stderr.write(f"{user.get_username()} is not staff: the device is of no use in the console yet")
        self.stdout.write(
            f"TOTP device {device.name!r} for {user.get_username()} (shown once; add it to an authenticator app):"
        )
        self.stdout.write(f"  {device.config_url}")
        self.stdout.write(f"  key (base32): {base64.b32encode(device.bin_key).decode('ascii')}")

    def _user(self, username: str):
        try:
            return get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user {username!r}") from None
