"""``manage.py demo_charge`` takes a payment end to end against a running worker and the
sandbox rail, as the development merchant ``make run`` creates."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from merchants.models import Merchant
from tests.charges_support import FAST_POLICY, apply_policy, use_rails, worker_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_demo_charge_settles_a_payment_as_the_development_merchant(settings, tmp_path, sandbox_rail, start_worker):
    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    apply_policy(settings, dict(FAST_POLICY))
    start_worker("--concurrency", "2", env=worker_env(rails_file, dict(FAST_POLICY)))
    out = io.StringIO()
    call_command("demo_charge", "--wait", "30", stdout=out)
    text = out.getvalue()
    assert "now: intent succeeded, charge succeeded" in text
    assert "payment_intent.succeeded" in text
    assert list(Merchant.objects.values_list("name", flat=True)) == ["Development merchant"]
