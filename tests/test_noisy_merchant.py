"""One merchant cannot slow every merchant's settlements (issue 23, item 6): a merchant whose
many endpoints answer only after 20 s, and who loops on ``/test``, against a real worker at
its default share rules, while another merchant's charge settles on time.

Without the reserved executors (registry ``merchant_paced``: webhook deliveries never hold the
last quarter of a worker) and the per-merchant webhook share, the slow deliveries held every executor and the
charge's poll waited behind them for the whole 20 s.
"""

from __future__ import annotations

import time

import pytest

from tests.charges_support import FAST_POLICY, Merchant, apply_policy, charge_of, scalar, use_rails, worker_env
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]

SLOW = 20  # seconds each of the noisy merchant's endpoints takes to answer


def test_a_merchant_with_slow_endpoints_and_a_test_loop_does_not_slow_another_merchants_settlements(
    settings, tmp_path, sandbox_rail, receiver, start_worker
):
    from webhooks.ssrf import parse_cidrs

    rails_file = use_rails(settings, tmp_path, sandbox_rail.rails())
    policy = {
        **FAST_POLICY,
        "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        "VPAY_WEBHOOK_FAN_OUT_IDLE": "0.5",
        "VPAY_WEBHOOK_TIMEOUT": str(SLOW + 5),
        "VPAY_WEBHOOK_LEASE_SECONDS": str(2 * (SLOW + 5) + 5),
    }
    apply_policy(settings, {k: v for k, v in policy.items() if k.startswith(("VPAY_CHARGE", "VPAY_RAIL"))})
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")

    noisy = Merchant("Noisy")
    tests_sent = 0
    for i in range(6):
        created = noisy.call(
            "POST",
            "/v1/webhook_endpoints",
            {"url": receiver.url(f"/hooks/noisy-{i}?mode=slow&delay={SLOW}"), "enabled_events": ["*"]},
        )
        assert created.status_code == 200, created.content
        for _ in range(3):  # a /test loop (rate-limited per merchant: the rest are refused)
            tests_sent += noisy.call("POST", f"/v1/webhook_endpoints/{created.json()['id']}/test").status_code == 200
    assert tests_sent >= 6

    # The default --concurrency (4): one executor webhooks never hold, and at most three
    # of the worker for any one merchant's webhooks.
    start_worker(env=worker_env(rails_file, policy)).wait_started()
    wait_for(
        lambda: scalar("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'") >= 2,
        timeout=20,
        message="the noisy merchant's slow deliveries to be in flight",
    )

    quiet = Merchant("Quiet")
    sandbox_rail.scenario(amount=4444, after_polls=1)
    started = time.monotonic()
    intent = quiet.confirm(quiet.intent(amount=4444)["id"])
    wait_for(
        lambda: (charge_of(intent["id"]) or {}).get("status") == "succeeded",
        timeout=SLOW - 5,
        message="the quiet merchant's charge to settle while the noisy merchant's webhooks hang",
    )
    assert time.monotonic() - started < SLOW - 5
