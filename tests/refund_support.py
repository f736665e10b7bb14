"""Helpers for the refunds and cancel tests: a merchant client with the refund calls and
its paid intents, and a second real connection that holds an intent's row lock so
two requests can be lined up to race for it."""

from __future__ import annotations

import threading
import time

import psycopg

from tests.charges_support import Merchant, scalar
from tests.conftest import database_url, wait_for
from tests.factories.payments import IntentFactory


class RefundingMerchant(Merchant):
    def refund(self, payment_intent: str, **fields):
        return self.call("POST", "/v1/refunds", {"payment_intent": payment_intent, **fields})

    def paid_intent(self, amount: int = 1000, currency: str = "usd") -> str:
        """The id of this merchant's ``IntentFactory(paid=True)``: confirmed on the sandbox push
        rail (so the rail holds its charge), then settled as the poll settles it, without a worker."""
        return IntentFactory(merchant=self.merchant, amount=amount, currency=currency, paid=True).id


def amount_refunded(intent_id: str) -> int:
    return scalar("SELECT amount_refunded FROM payment_intents WHERE id = %s", [intent_id])


class RowLock:
    """``SELECT … FOR UPDATE`` on one payment intent from a connection of its own, held until
    :meth:`release`: requests started meanwhile queue behind it, and are let go together."""

    def __init__(self, intent_id: str) -> None:
        self.conn = psycopg.connect(database_url(), autocommit=False)
        self.conn.execute("SELECT 1 FROM payment_intents WHERE id = %s FOR UPDATE", [intent_id])
        self.pid = self.conn.info.backend_pid

    def waiters(self) -> int:
        """Backends of this database waiting for a lock (the first behind this connection,
        the others behind the first's tuple lock)."""
        return scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def race(lock: RowLock, *calls, waiters: int | None = None) -> list:
    """Start each call in a thread of its own (each with its own database connection), wait
    until ``waiters`` backends queue behind ``lock`` (default: one per call), release it,
    and return the calls' results in order."""
    from django.db import connection

    results: list = [None] * len(calls)

    def run(i: int, call) -> None:
        try:
            results[i] = call()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: lock.waiters() >= (waiters or len(calls)), 10, message="both requests queued on the lock")
        time.sleep(0.1)  # nothing else is on its way to the lock
    finally:
        lock.release()
        for t in threads:
            t.join(timeout=20)
    return results
