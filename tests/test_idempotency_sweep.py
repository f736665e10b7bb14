"""The idempotency sweep against a key being reused at the same moment, with two real
connections: the sweep must never delete a record the reuse has just made fresh."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from api import idempotency
from merchants.services import create_merchant
from tests.charges_support import scalar, sql


class _NoHeartbeat:
    def heartbeat(self) -> None:
        pass


def _waiting_on_a_lock(pid: int) -> bool:
    return bool(scalar("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]))


@pytest.mark.django_db(transaction=True)
def test_a_key_reused_after_24_hours_while_the_sweep_runs_keeps_its_fresh_record():
    merchant, _key = create_merchant(name="Reuse")
    hashed = idempotency.request_hash("POST", "/v1/customers", b"{}")
    assert idempotency.store(merchant.id, "reused", hashed, 200, b'{"id": "cus_old"}')
    sql("UPDATE api_idempotency_records SET created_at = now() - interval '25 hours'")

    sweep: dict = {}
    started = threading.Event()

    def run_sweep() -> None:
        try:
            connection.ensure_connection()
            sweep["pid"] = connection.connection.info.backend_pid
            started.set()
            sweep["deleted"] = idempotency.sweep_expired_records(_NoHeartbeat()).count
        finally:
            connection.close()

    with transaction.atomic():
        # The retried request re-stores the expired record in place (ON CONFLICT DO UPDATE)
        # and its transaction is still open when the sweep reaches the row.
        assert idempotency.store(merchant.id, "reused", hashed, 200, b'{"id": "cus_new"}')
        thread = threading.Thread(target=run_sweep)
        thread.start()
        assert started.wait(5)
        deadline = time.monotonic() + 5
        while not _waiting_on_a_lock(sweep["pid"]):
            assert time.monotonic() < deadline, "the sweep never reached the row being re-stored"
            time.sleep(0.02)
    thread.join(timeout=10)
    # The sweep had picked the row while it was expired; by the time it could delete it,
    # the row was fresh, so it must not have.
    assert sweep["deleted"] == 0
    stored = idempotency.lookup(merchant.id, "reused")
    assert stored is not None and stored.body == b'{"id": "cus_new"}'
