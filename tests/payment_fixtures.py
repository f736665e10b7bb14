"""Shared fixtures of the payments tests (registered in tests/conftest.py's pytest_plugins):
merchants' API clients with the sandbox rail configured, and the stack the worker tests drive.

The clients are ``acme_api`` / ``globex_api``, not ``acme`` / ``globex``: conftest.py's own
``acme`` and ``globex`` (bare clients, no rail) would shadow a plugin's fixtures of those names.
"""

from __future__ import annotations

import pytest

from tests.charges_support import FAST_POLICY, apply_policy, intent_status, use_rails, worker_env
from tests.conftest import wait_for
from tests.refund_support import RefundingMerchant


@pytest.fixture
def acme_api(rails):
    """Acme's client for the payments API (intents, confirms, refunds), on the sandbox rail."""
    return RefundingMerchant("Acme")


@pytest.fixture
def globex_api(rails):
    """A second merchant's client, for what one merchant must not see of another's."""
    return RefundingMerchant("Globex")


@pytest.fixture
def payment_policy() -> dict:
    """The policy ``payment_stack`` starts from; a test module overrides it for its own."""
    return FAST_POLICY


class PaymentStack:
    """The sandbox rail, Acme's client, and real workers started with the stack's policy (the
    same numbers in this process's settings, for what the web side decides)."""

    def __init__(self, settings, rails_file: str, rail, start_worker, policy: dict) -> None:
        self._settings, self._rails_file, self._start_worker = settings, rails_file, start_worker
        self.rail = rail
        self.acme = RefundingMerchant("Acme")
        self.policy = dict(policy)
        apply_policy(settings, self.policy)

    def set_policy(self, **changes) -> None:
        """For the workers started from now on, and for this process."""
        self.policy.update(changes)
        apply_policy(self._settings, self.policy)

    def worker(self, *args: str):
        return self._start_worker("--concurrency", "2", *args, env=worker_env(self._rails_file, self.policy))

    def paid(self, amount: int) -> tuple[str, str]:
        """An intent a worker settled at the rail (a worker must be running): (intent id, charge id)."""
        intent = self.acme.confirm(self.acme.intent(amount=amount)["id"])
        wait_for(lambda: intent_status(intent["id"]) == "succeeded", 30, message="paid")
        return intent["id"], intent["charge"]["id"]

    def posts(self, reference: str) -> list[dict]:
        """The submits the rail received for a charge or refund."""
        return [r for r in self.rail.requests(reference) if r["method"] == "POST"]

    def polls(self, reference: str) -> list[dict]:
        """The status requests the rail received for a charge or refund."""
        return [r for r in self.rail.requests(reference) if r["method"] == "GET"]

    def refunds_at_rail(self, charge_id: str) -> list[dict]:
        return self.rail._get(f"/__admin/refunds?charge_reference={charge_id}")["refunds"]


@pytest.fixture
def payment_stack(settings, tmp_path, sandbox_rail, start_worker, payment_policy) -> PaymentStack:
    """Rails on the sandbox and ``payment_policy`` applied; ``worker()`` starts a worker with it."""
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    return PaymentStack(settings, rails_file, sandbox_rail, start_worker, payment_policy)
