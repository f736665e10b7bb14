"""The charges read behind the operator gauges (vpay.sql_gauges)."""

from __future__ import annotations

from django.db import connection

from charges.states import CHARGE_LIVE

# Charges not yet terminal, by rail and state: the partial index charges_live_idx holds
# exactly these rows (rails are a configured handful, states six).
_LIVE = "SELECT rail, status, count(*) FROM charges WHERE status = ANY(%s) GROUP BY rail, status"


def live_by_rail_and_state() -> list[tuple[str, str, int]]:
    with connection.cursor() as cursor:
        cursor.execute(_LIVE, [sorted(CHARGE_LIVE)])
        return cursor.fetchall()
