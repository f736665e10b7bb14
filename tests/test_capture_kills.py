"""Kill the real ``runworker`` inside a capture and a void (``vpay.faultpoints``, as
``tests/test_killpoints.py`` does for the money path): after the request row is committed
and before it is sent, and after the rail answered and before the answer is recorded. A
replacement finishes, and the rail's own log shows one capture (one void) applied."""

from __future__ import annotations

import signal

import pytest

from tests.charges_support import intent_status, scalar, worker_env
from tests.conftest import wait_for
from tests.killpoints_support import kill_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A dead worker's lease is another's to take within a second (tests/test_killpoints.py's).
QUICK_LIVENESS = ("--heartbeat", "0.25")


def authorized(stack) -> tuple[str, str]:
    """A manual-capture intent the rail authorized, by a worker since stopped: (intent, charge)."""
    worker = stack.worker()
    intent = stack.acme.confirm(stack.acme.intent(amount=5000, capture_method="manual")["id"])
    wait_for(lambda: intent_status(intent["id"]) == "requires_capture", 30, message="the authorization")
    worker.stop()
    return intent["id"], intent["charge"]["id"]


@pytest.mark.parametrize(
    ("spec", "action", "charge_ends"),
    [
        ("rail.request_recorded@capture:1", "capture", "succeeded"),  # recorded, never sent
        ("rail.answered@capture:1", "capture", "succeeded"),  # captured at the rail, answer lost
        ("rail.answered@void:1", "cancel", "voided"),
    ],
)
def test_a_worker_killed_inside_a_capture_or_a_void_leaves_one_applied_at_the_rail(
    payment_stack, start_worker, tmp_path, spec, action, charge_ends
):
    intent_id, charge_id = authorized(payment_stack)
    assert payment_stack.acme.call("POST", f"/v1/payment_intents/{intent_id}/{action}", {}).status_code == 200
    env = {**worker_env(payment_stack._rails_file, payment_stack.policy), **kill_env(tmp_path, spec)}
    doomed = start_worker("--concurrency", "2", *QUICK_LIVENESS, env=env)
    assert doomed.wait(timeout=60) == -signal.SIGKILL, doomed.output()[-2000:]
    assert f"fault injection: SIGKILL at {spec.split('@')[0]}" in doomed.output()
    payment_stack.worker(*QUICK_LIVENESS)  # the replacement
    wait_for(
        lambda: scalar("SELECT status FROM charges WHERE id = %s", [charge_id]) == charge_ends,
        60,
        message=f"the charge to end {charge_ends}",
    )
    held = payment_stack.rail.charge(charge_id)
    if action == "capture":
        assert held["settled"] == "succeeded" and held["amount_captured"] == 5000
        assert held["captures"] == 1  # one capture request reached the rail: never sent twice
        assert intent_status(intent_id) == "succeeded"
    else:
        assert held["settled"] == "canceled" and held["voids"] == 1
        assert intent_status(intent_id) == "canceled"
