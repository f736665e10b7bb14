"""``python manage.py dbroletimeouts``: the timeouts as the role's session defaults.

Behind a transaction-pooling PgBouncer (``VPAY_DB_POOLER=transaction``) no connection can
carry them as startup options, so they are set on the role, for this database only
(``ALTER ROLE … IN DATABASE … SET``): every server session PgBouncer opens starts with them.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection

from vpay import db_role
from vpay.errors import error_chain


class Command(BaseCommand):
    help = (
        "Print (or, with --apply, run) the ALTER ROLE ... IN DATABASE ... SET statements that give the "
        "database role vpay's statement and idle-in-transaction timeouts (VPAY_DB_STATEMENT_TIMEOUT_MS, "
        "VPAY_DB_IDLE_IN_TX_TIMEOUT_MS) and READ COMMITTED; --check exits 1 when sessions do not run under them."
    )

    def add_arguments(self, parser):
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--apply", action="store_true", help="Run the statements (new sessions get them).")
        mode.add_argument("--check", action="store_true", help="Compare a new session's timeouts with the settings.")

    def handle(self, *args, **opts):
        try:
            current = db_role.current_timeouts()
            if opts["check"]:
                problems = db_role.problems()
                if problems:
                    raise CommandError(
                        f"role {current['role']} in {current['database']}: "
                        + "; ".join(problems)
                        + " (run `python manage.py dbroletimeouts --apply`)"
                    )
                self.stdout.write(f"role {current['role']} in {current['database']}: timeouts as configured")
                return
            statements = db_role.statements(current["role"], current["database"])
            if not opts["apply"]:
                self.stdout.write(";\n".join(statements) + ";")
                return
            with connection.cursor() as cursor:
                for statement in statements:
                    # A role's session default for this database (pg_db_role_setting). No index.
                    cursor.execute(statement)
                    self.stdout.write(f"{statement};")
            self.stdout.write("done: sessions opened from now on run under these timeouts")
        except DatabaseError as exc:
            raise CommandError(f"the database refused: {error_chain(exc, 500)}") from exc
