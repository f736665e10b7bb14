"""The role's session defaults, which carry the timeouts behind a transaction pooler, and
READ COMMITTED (every cap and ceiling locks, then counts in a statement of its own whose
snapshot must be taken after the lock; a direct connection asks for it at startup).

``manage.py dbroletimeouts`` writes them and ``runworker`` checks them at startup
(``vpay.db_pooler`` decides what the timeouts should be).
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from vpay.db_pooler import role_timeout_statements, role_timeouts, timeout_problems

ISOLATION = "read committed"


def role_settings() -> dict[str, str]:
    """Everything the role's session defaults must carry: the timeouts and the isolation."""
    return {**expected_timeouts(), "default_transaction_isolation": ISOLATION}


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
            " current_setting('idle_in_transaction_session_timeout'), current_setting('default_transaction_isolation')"
        )
        role, database, statement, idle, isolation = cursor.fetchone()
    return {
        "role": role,
        "database": database,
        "statement_timeout": statement,
        "idle_in_transaction_session_timeout": idle,
        "default_transaction_isolation": isolation,
    }


def statements(role: str, database: str) -> list[str]:
    return role_timeout_statements(role=role, database=database, timeouts=role_settings())


def problems() -> list[str]:
    current = current_timeouts()
    found = timeout_problems(expected=expected_timeouts(), actual=current)
    if current["default_transaction_isolation"] != ISOLATION:
        found.append(f"default_transaction_isolation is {current['default_transaction_isolation']}, not {ISOLATION}")
    return found
