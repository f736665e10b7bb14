"""Shared by the Hypothesis state machines (tests/test_*_states.py): the example budgets and
the check that every observed change of a row is an edge of its table in
docs/architecture.md §8."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping

from django.db import connection
from hypothesis import HealthCheck, settings

# The normal suite runs a few seconds per machine; `make rehearse` (pytest -m rehearse) a
# budget fifty times larger. VPAY_TEST_STATE_EXAMPLES overrides both, to hunt locally.
FAST = settings(
    max_examples=int(os.environ.get("VPAY_TEST_STATE_EXAMPLES", 12)),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,  # CI reruns the same examples: a failure there reproduces locally
    database=None,
)
HEAVY = settings(
    max_examples=int(os.environ.get("VPAY_TEST_STATE_EXAMPLES", 300)),
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)


def truncate(*tables: str) -> None:
    """Empty ``tables`` (in order) for the next example: DELETE, which on a few rows is
    far quicker than TRUNCATE's new files."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DELETE FROM {table}")


def check_edges(
    what: str,
    before: Mapping[Hashable, object],
    after: Mapping[Hashable, object],
    allowed: set[tuple[object, object]],
    rule: str,
) -> None:
    """Every row whose state changed moved along an allowed edge (``None``: no row)."""
    for key in set(before) | set(after):
        old, new = before.get(key), after.get(key)
        if old != new:
            assert (old, new) in allowed, f"{what} {key}: {old} -> {new} is no edge of its table (rule {rule})"


def sql(query: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []
