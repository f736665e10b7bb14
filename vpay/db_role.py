"""The role's session defaults, which carry the timeouts behind a transaction pooler.

``manage.py dbroletimeouts`` writes them and ``runworker`` checks them at startup
(``vpay.db_pooler`` decides what they should be).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from vpay.db_pooler import role_timeout_statements, role_timeouts, timeout_problems


def expected_timeouts() -> dict[str, str]:
    return role_timeouts(
        statement_timeout_ms=settings.DB_STATEMENT_TIMEOUT_MS,
        idle_in_tx_timeout_ms=settings.DB_IDLE_IN_TX_TIMEOUT_MS,
    )


def current_timeouts() -> dict[str, str]:
    """What a session gets from the server (through the pooler: whichever server session serves us)."""
    with connection.cursor() as cursor:
        # The role, the database and each timeout as this session sees it. No table read.
        cursor.execute(
            "SELECT current_user, current_database(), current_setting('statement_timeout'),"
            " current_setting('idle_in_transaction_session_timeout')"
        )
        role, database, statement, idle = cursor.fetchone()
    return {
        "role": role,
        "database": database,
        "statement_timeout": statement,
        "idle_in_transaction_session_timeout": idle,
    }


def statements(role: str, database: str) -> list[str]:
    return role_timeout_statements(role=role, database=database, timeouts=expected_timeouts())


def problems() -> list[str]:
    return timeout_problems(expected=expected_timeouts(), actual=current_timeouts())
