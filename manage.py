#!/usr/bin/env python
"""Django's command-line utility for vpay."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    from vpay.embedded_db import ensure_running_if_used

    try:
        # Every command: a refused configuration (live mode without DATABASE_URL, ...)
        # stops here with the setting's name, and development starts its embedded database.
        ensure_running_if_used()
    except ImproperlyConfigured as exc:
        sys.exit(f"vpay: refusing to start: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
