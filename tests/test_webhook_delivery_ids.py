"""Webhook delivery wire ids are random (issue 23 item 10): new rows get one from the
database, whatever inserts them, and the migration gives one to every row made before it.
Real database; the migration is run backwards and forwards on it."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from merchants.services import create_merchant
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import WebhookDelivery
from webhooks.services import endpoints, fanout

WIRE_ID = re.compile(r"whd_[0-9a-f]{32}")


def sql(query, params=None):
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else cursor.rowcount


def migrate(target=None):
    """To ``target``, or (None) to the latest migration of every app, where every other test expects the schema."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target] if target else executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_every_existing_delivery_a_random_id_and_new_ones_get_theirs():
    merchant = create_merchant("Acme")[0]
    endpoints.create_endpoint(merchant, url="https://hooks.example.com/a", enabled_events=["*"])
    endpoints.create_endpoint(merchant, url="https://hooks.example.com/b", enabled_events=["*"])
    try:
        migrate(("webhooks", "0011_events_pending_failed_before"))
        assert "public_id" not in [
            c.name for c in connection.introspection.get_table_description(connection.cursor(), "webhook_deliveries")
        ]
        # Events as that schema holds them (today's emit writes columns it did not have yet).
        for i in range(3):
            sql(
                "INSERT INTO events (id, merchant_id, type, data) VALUES (%s, %s, %s, %s::jsonb)",
                [f"evt_old_{i}", merchant.id, EventType.PAYMENT_INTENT_SUCCEEDED.value, f'{{"id": "pi_{i}"}}'],
            )
        # The fan-out's own insert, on the old schema (it names no public_id).
        with transaction.atomic():
            from webhooks import repository

            repository.create_deliveries([e for (e,) in sql("SELECT id FROM events")])
        assert sql("SELECT count(*) FROM webhook_deliveries") == [(6,)]
    finally:
        migrate()
    ids = [r[0] for r in sql("SELECT public_id FROM webhook_deliveries ORDER BY id")]
    assert len(ids) == 6 and all(WIRE_ID.fullmatch(i) for i in ids) and len(set(ids)) == 6
    # New rows, from the fan-out's one-statement insert and from the ORM, get theirs from the default.
    with transaction.atomic():
        emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, {"id": "pi_new", "object": "payment_intent"})
    fanout.drain_once()
    fresh = WebhookDelivery.objects.exclude(public_id__in=ids)
    assert fresh.count() == 2 and all(WIRE_ID.fullmatch(d.public_id) for d in fresh)
    # NOT NULL and unique, enforced by the database.
    assert sql(
        "SELECT is_nullable FROM information_schema.columns"
        " WHERE table_name = 'webhook_deliveries' AND column_name = 'public_id'"
    ) == [("NO",)]
    assert sql(
        "SELECT conname, contype FROM pg_constraint WHERE conrelid = 'webhook_deliveries'::regclass"
        " AND conname LIKE 'webhook_deliveries_public_id%%' AND contype IN ('u', 'c') ORDER BY 1"
    ) == [("webhook_deliveries_public_id", "u")]  # the migration's temporary CHECK is gone
