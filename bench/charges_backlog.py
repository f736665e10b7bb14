"""A backlog of submitted charges whose polls are due, exactly as confirms leave them, made fast.

One intent is confirmed through ``charges.services.confirm.confirm_intent`` (the API view's
body) with no worker running: its intent, charge, submit request row and poll job are the
template. The other intents are then given copies of those rows in four ``INSERT … SELECT``
/ ``UPDATE`` statements (every column copied from the template's row but the ids, the
references between them and the instants, which are the database's ``now()``), and the
rail is told about each copy by the same POST the confirm sent (its submit, under the
charge's reference): the worker's GET then finds a charge the rail knows, as after a real
confirm. A push rail only: its charges carry no pay_token (checked).

Used by ``bench_charges.py --mode worker`` and its statement count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from django.db import connection, transaction

# Columns the copies do not take from the template: identity columns are left to their
# defaults, and these are given per copy (``p`` is the (intent_id, charge_id) pair).
_OVERRIDES = {
    "charges": {"id": "p.charge_id", "intent_id": "p.intent_id", "created_at": "now()", "updated_at": "now()"},
    "provider_requests": {
        "charge_id": "p.charge_id",
        "idempotency_key": "p.charge_id",
        "sent_at": "now()",
        "answered_at": "now()",
    },
    "jobs": {
        "job_id": "gen_random_uuid()",
        "payload": "jsonb_build_object('charge_id', p.charge_id)",
        "dedupe_key": "'charge:poll:' || p.charge_id",
        "run_at": "now()",
        "created_at": "now()",
    },
}
# Which template row each table copies, and how the copy's WHERE finds it.
_TEMPLATE_ROW = {
    "charges": "t.id = %(charge)s",
    "provider_requests": "t.charge_id = %(charge)s AND t.operation = 'submit'",
    "jobs": "t.dedupe_key = 'charge:poll:' || %(charge)s",
}


def _columns(cursor, table: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s AND is_identity = 'NO'"
        " ORDER BY ordinal_position",
        [table],
    )
    return [r[0] for r in cursor.fetchall()]


def _copy(cursor, table: str, template_charge: str, intents: list[str], charges: list[str]) -> int:
    columns = _columns(cursor, table)
    exprs = [_OVERRIDES[table].get(c, f"t.{c}") for c in columns]
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(columns)})"
        f" SELECT {', '.join(exprs)}"
        f"   FROM {table} t CROSS JOIN unnest(%(intents)s::text[], %(charges)s::text[]) AS p(intent_id, charge_id)"
        f"  WHERE {_TEMPLATE_ROW[table]}",
        {"charge": template_charge, "intents": intents, "charges": charges},
    )
    return cursor.rowcount


def make_backlog(merchant, intent_ids: list[str], seed_threads: int = 8) -> str:
    """Confirm ``intent_ids[0]``, copy its rows to the rest; returns the template charge's id."""
    from charges.models import new_charge_id
    from charges.rails import get_rail
    from charges.rails.adapter import adapter_for
    from charges.services.confirm import confirm_intent

    template = confirm_intent(merchant, intent_ids[0])
    charge = template.charge
    if charge.status != "submitted" or charge.pay_token:
        raise RuntimeError(f"the template confirm left {charge.status!r} (a push rail answering pending expected)")
    others = intent_ids[1:]
    charge_ids = [new_charge_id() for _ in others]

    # The rail learns each copy as it learnt the template: its submit, keyed by reference.
    rail = get_rail(template.rail)
    adapter = adapter_for(rail)

    def seed(ids: list[str]) -> None:
        for charge_id in ids:
            adapter.submit(reference=charge_id, amount=charge.amount, currency=charge.currency)

    with ThreadPoolExecutor(seed_threads) as pool:
        list(pool.map(seed, [charge_ids[k::seed_threads] for k in range(seed_threads)]))

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE payment_intents i SET status = t.status, updated_at = now()"
            "  FROM payment_intents t WHERE t.id = %s AND i.id = ANY(%s)",
            [intent_ids[0], others],
        )
        for table in ("charges", "provider_requests", "jobs"):
            copied = _copy(cursor, table, charge.id, others, charge_ids)
            if copied != len(others):
                raise RuntimeError(f"{table}: {copied} copies for {len(others)} intents")
    return charge.id
