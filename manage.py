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
    import django
    from django.db import DatabaseError

    from vpay.startup_heap import startup_heap

    try:
        with startup_heap():
            # Set up here, under the paused collector (vpay/startup_heap.py). The command line's
            # own django.setup() then finds the apps ready and applies the same logging again.
            django.setup()
        execute_from_command_line(sys.argv)
    except DatabaseError as exc:
        # A database that refuses, never answers or keeps a lock: one line naming the
        # bound, not a traceback (vpay/db_errors.py); any other error keeps its traceback.
        from vpay.db_errors import unavailable_message

        message = unavailable_message(exc)
        if message is None:
            raise
        sys.exit(f"vpay: {message}")


if __name__ == "__main__":
    main()
