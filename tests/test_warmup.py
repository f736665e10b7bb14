"""What a worker builds at boot so that its first job does not (jobs/runner/warmup.py): the
webhook sender's TLS context and each rail's client, 20-30 ms each, which the first delivery
and the first poll of every process paid (the p99 of the idle commit -> receipt latency)."""

from __future__ import annotations

import logging

import pytest

from jobs.runner import warmup
from jobs.runner.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_workers_boot_builds_the_tls_context_and_every_rail_client(monkeypatch):
    from charges.rails import adapter as rail_adapter
    from charges.rails import configured_rails
    from webhooks.services import transport

    monkeypatch.setattr(transport, "_SSL_CONTEXT", None)
    monkeypatch.setattr(rail_adapter, "_adapters", {})
    Worker().boot()
    assert transport._SSL_CONTEXT is not None
    assert set(rail_adapter._adapters) == set(configured_rails()) and rail_adapter._adapters


def test_a_warm_up_that_fails_is_logged_and_the_boot_goes_on(monkeypatch, caplog):
    def broken() -> None:
        raise OSError("no CA bundle")

    monkeypatch.setattr(warmup, "_WARM_UPS", {"a broken thing": broken, **warmup._WARM_UPS})
    with caplog.at_level(logging.WARNING, logger="jobs.runner.warmup"):
        Worker().boot()
    assert any("a broken thing" in r.getMessage() for r in caplog.records)
