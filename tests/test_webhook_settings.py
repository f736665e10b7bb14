"""Webhook settings that must refuse to start, the lease check, and emit() waking the drain."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection, transaction

from jobs.adapters.postgres import enqueue
from jobs.kinds import JobKind
from jobs.registry import Singleton
from merchants.services import create_merchant
from webhooks.checks import check_webhook_settings, lease_problems
from webhooks.event_types import EventType
from webhooks.events import emit

ROOT = Path(__file__).resolve().parent.parent
FERNET_KEY = "uK3mJ1tq0J0Xx9m1Yv7yqk0pP2o2b5m8y4r6t8w0z2c="


def manage_check(**env) -> subprocess.CompletedProcess:
    from tests.conftest import database_url

    base = {"PATH": "/usr/bin:/bin", "DATABASE_URL": database_url(), "DJANGO_SECRET_KEY": "x" * 50}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.django_db
def test_the_allow_list_refuses_to_start_in_live_mode():
    result = manage_check(VPAY_LIVE_MODE="1", VPAY_SECRETS_KEY=FERNET_KEY, VPAY_WEBHOOK_ALLOW_CIDRS="127.0.0.1/32")
    assert result.returncode != 0
    assert "VPAY_WEBHOOK_ALLOW_CIDRS cannot be used in live mode" in result.stderr
    # The same allow-list in development starts.
    assert manage_check(VPAY_WEBHOOK_ALLOW_CIDRS="127.0.0.1/32").returncode == 0


@pytest.mark.django_db
def test_live_mode_requires_the_secrets_key_and_never_echoes_a_bad_one():
    result = manage_check(VPAY_LIVE_MODE="1")
    assert result.returncode != 0 and "VPAY_SECRETS_KEY must be set in live mode" in result.stderr
    bad = manage_check(VPAY_SECRETS_KEY="whsec_this-is-not-a-fernet-key")
    assert bad.returncode != 0 and "key #1 is not a Fernet key" in bad.stderr
    assert "this-is-not-a-fernet-key" not in bad.stderr + bad.stdout


def test_a_lease_shorter_than_twice_the_timeout_is_refused(settings):
    assert lease_problems() == [] and check_webhook_settings() == []
    settings.VPAY_WEBHOOK_TIMEOUT = 31.0  # the lease is 60
    [problem] = lease_problems()
    assert "VPAY_WEBHOOK_LEASE_SECONDS=60" in problem
    assert [e.id for e in check_webhook_settings()] == ["webhooks.E001"]


@pytest.mark.django_db(transaction=True)
def test_emit_wakes_the_fan_out_drain_once_at_commit_and_not_on_rollback():
    key = Singleton().dedupe_key(JobKind.WEBHOOK_FAN_OUT.value)
    enqueue(JobKind.WEBHOOK_FAN_OUT, {}, dedupe_key=key, delay=3600)

    def due() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT run_at <= now() FROM jobs WHERE dedupe_key = %s", [key])
            return cursor.fetchone()[0]

    merchant, _ = create_merchant("Acme")
    obj = {"id": "pi_1", "object": "payment_intent"}
    with pytest.raises(RuntimeError), transaction.atomic():
        emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, obj)
        raise RuntimeError("the change failed")
    assert not due()
    with transaction.atomic():
        for _ in range(3):
            emit(merchant, EventType.PAYMENT_INTENT_SUCCEEDED, obj)
        assert len(connection.run_on_commit) == 1  # one wake for the transaction
        assert not due()  # not before the commit
    assert due()
