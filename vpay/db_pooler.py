"""Where the database session's settings come from, with and without a transaction pooler.

Directly on PostgreSQL (``VPAY_DB_POOLER=none``) every connection carries its timeouts as
the libpq ``options`` startup parameter. A transaction-pooling PgBouncer
(``VPAY_DB_POOLER=transaction``) refuses that parameter (1.18, Debian's) and hands each
transaction to whichever server connection is free, so nothing may ride on the session:
the timeouts come from the role (``ALTER ROLE … IN DATABASE … SET``, written by
``manage.py dbroletimeouts``), a worker's long fenced transaction raises its own
idle-in-transaction allowance with ``SET LOCAL`` (:func:`fenced_idle_in_tx_ms`, in
``jobs.runner.invoke``), no statement is prepared on the server, and ``LISTEN`` goes over
``DATABASE_DIRECT_URL`` or not at all (:func:`wake_source`). Pure functions only.
"""

from __future__ import annotations

from enum import StrEnum

POOLER_MODES = ("none", "transaction")


class WakeSource(StrEnum):
    """Where a worker's ``LISTEN`` connection goes, if anywhere."""

    DIRECT = "direct"  # DATABASE_DIRECT_URL: a session of its own on the server
    DEFAULT = "default"  # DATABASE_URL, which is the server itself (no pooler)
    POLL = "poll"  # only a transaction pooler: no LISTEN, idle executors poll


def wake_source(*, pooler: str, direct_url: bool) -> WakeSource:
    """``LISTEN`` needs a session: a direct URL wins, the pooled URL never carries it."""
    if direct_url:
        return WakeSource.DIRECT
    return WakeSource.POLL if pooler == "transaction" else WakeSource.DEFAULT


def startup_options(*, pooler: str, statement_timeout_ms: int, idle_in_tx_timeout_ms: int) -> dict[str, str]:
    """The libpq ``options`` a connection sends at startup: the timeouts, JIT off (vpay's
    statements are short; a JIT compile costs a claim a second on a big table) and READ
    COMMITTED whatever the role's or database's default (every cap and ceiling locks, then
    counts in a statement of its own, whose snapshot must be taken after the lock: under
    REPEATABLE READ it would be the transaction's first, and two workers could take the last
    slot); or nothing behind a pooler (the claim turns JIT off in its own transaction,
    ``jobs.storage.sql``; the isolation is the role's, docs/deploy.md)."""
    if pooler == "transaction":
        return {}
    return {
        "options": f"-c statement_timeout={statement_timeout_ms}"
        f" -c idle_in_transaction_session_timeout={idle_in_tx_timeout_ms} -c jit=off"
        " -c default_transaction_isolation=read\\ committed"
    }


def role_timeouts(*, statement_timeout_ms: int, idle_in_tx_timeout_ms: int) -> dict[str, str]:
    """The session defaults a pooled role must carry, as ``current_setting`` shows them."""
    return {
        "statement_timeout": _ms_text(statement_timeout_ms),
        "idle_in_transaction_session_timeout": _ms_text(idle_in_tx_timeout_ms),
    }


def role_timeout_statements(*, role: str, database: str, timeouts: dict[str, str]) -> list[str]:
    """``ALTER ROLE … IN DATABASE … SET`` for each timeout: scoped to this database only."""
    return [
        f"ALTER ROLE {_ident(role)} IN DATABASE {_ident(database)} SET {name} = '{value}'"
        for name, value in timeouts.items()
    ]


def timeout_problems(*, expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    """What the pooled sessions run under that differs from the settings, one line each."""
    return [
        f"{name} is {actual.get(name, '?')}, not {value}"
        for name, value in expected.items()
        if _ms(actual.get(name, "")) != _ms(value)
    ]


def fenced_idle_in_tx_ms(*, kind_lease_seconds: float, default_ms: int) -> int:
    """A fenced handler's transaction stays open up to its kind's lease: never less than the default."""
    return max(int(kind_lease_seconds * 1000), default_ms)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _ms_text(ms: int) -> str:
    return f"{ms}ms"


_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _ms(text: str) -> float | None:
    """PostgreSQL's display of a time setting (``30s``, ``1min``, ``0``) in milliseconds."""
    text = text.strip()
    for unit in sorted(_UNITS_MS, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].strip().lstrip("-").replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * _UNITS_MS[unit]
    return float(text) if text.isdigit() else None
