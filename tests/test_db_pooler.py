"""The pooler's decisions (vpay/db_pooler.py), row by row: pure, no database."""

from __future__ import annotations

import itertools

import pytest

from vpay.db_pooler import (
    POOLER_MODES,
    WakeSource,
    fenced_idle_in_tx_ms,
    role_timeout_statements,
    role_timeouts,
    startup_options,
    timeout_problems,
    wake_source,
)


@pytest.mark.parametrize(("pooler", "direct_url"), list(itertools.product(POOLER_MODES, [False, True])))
def test_where_the_listen_session_goes(pooler, direct_url):
    expected = {
        ("none", False): WakeSource.DEFAULT,
        ("none", True): WakeSource.DIRECT,
        ("transaction", False): WakeSource.POLL,  # LISTEN through a transaction pooler hears nothing reliably
        ("transaction", True): WakeSource.DIRECT,
    }[(pooler, direct_url)]
    assert wake_source(pooler=pooler, direct_url=direct_url) is expected


@pytest.mark.parametrize("pooler", POOLER_MODES)
def test_startup_options_carry_the_timeouts_only_without_a_pooler(pooler):
    options = startup_options(pooler=pooler, statement_timeout_ms=30_000, idle_in_tx_timeout_ms=60_000)
    if pooler == "transaction":
        assert options == {}  # PgBouncer 1.18 refuses the options startup parameter
    else:
        assert options == {
            "options": "-c statement_timeout=30000 -c idle_in_transaction_session_timeout=60000 -c jit=off"
            " -c default_transaction_isolation=read\\ committed"  # libpq: a backslash escapes the space
        }


def test_the_role_statements_are_scoped_to_the_database_and_quote_names():
    statements = role_timeout_statements(
        role='we"ird', database="vpay", timeouts=role_timeouts(statement_timeout_ms=1500, idle_in_tx_timeout_ms=60_000)
    )
    assert statements == [
        """ALTER ROLE "we""ird" IN DATABASE "vpay" SET statement_timeout = '1500ms'""",
        """ALTER ROLE "we""ird" IN DATABASE "vpay" SET idle_in_transaction_session_timeout = '60000ms'""",
    ]


EXPECTED = role_timeouts(statement_timeout_ms=30_000, idle_in_tx_timeout_ms=60_000)


@pytest.mark.parametrize(
    ("statement", "idle", "problems"),
    [
        ("30s", "1min", []),  # how PostgreSQL shows the role's values
        ("30000ms", "60000ms", []),
        ("30000", "60000", []),  # a bare number is milliseconds
        ("0", "1min", ["statement_timeout is 0, not 30000ms"]),  # nothing set: no timeout at all
        ("30s", "0", ["idle_in_transaction_session_timeout is 0, not 60000ms"]),
        ("1h", "1min", ["statement_timeout is 1h, not 30000ms"]),
        (
            "500us",
            "1d",
            ["statement_timeout is 500us, not 30000ms", "idle_in_transaction_session_timeout is 1d, not 60000ms"],
        ),
        ("nonsense", "1min", ["statement_timeout is nonsense, not 30000ms"]),
    ],
)
def test_timeout_problems(statement, idle, problems):
    actual = {"statement_timeout": statement, "idle_in_transaction_session_timeout": idle}
    assert timeout_problems(expected=EXPECTED, actual=actual) == problems


def test_a_missing_setting_is_a_problem():
    assert timeout_problems(expected=EXPECTED, actual={}) == [
        "statement_timeout is ?, not 30000ms",
        "idle_in_transaction_session_timeout is ?, not 60000ms",
    ]


@pytest.mark.parametrize(
    ("lease", "default", "expected"), [(330.0, 60_000, 330_000), (32.0, 60_000, 60_000), (60.0, 60_000, 60_000)]
)
def test_a_fenced_transaction_is_allowed_its_lease_and_never_less_than_the_default(lease, default, expected):
    assert fenced_idle_in_tx_ms(kind_lease_seconds=lease, default_ms=default) == expected
