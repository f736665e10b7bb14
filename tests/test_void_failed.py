"""A charge vpay fails on its own is voided at its rail (charges/services/void_failed.py), in
process against the real sandbox rail: a dead redirect order the rail still held, a refused
submit the rail kept, and a late success: the rail says the money moved, and it is
recorded and paged, never lost."""

from __future__ import annotations

import time

import httpx
import pytest

from charges.models import Charge
from jobs import port as queue
from tests.charges_support import intent_status, run_worker_until, scalar
from tests.conftest import wait_for
from tests.rail_support import API_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def voids_at_rail(rail, charge_id: str) -> list[dict]:
    return [r for r in rail.requests(charge_id) if r.get("kind") == "void"]


def refused_but_kept(acme, rails, amount: int) -> dict:
    """A push charge whose submit the rail refused (422) and kept all the same."""
    rails.scenario(amount=amount, submit_status=422, submit_records=True)
    intent = acme.confirm(acme.intent(amount=amount)["id"])
    assert (intent["status"], intent["charge"]["failure_code"]) == ("failed", "rail_rejected")
    return intent


def test_a_refused_submit_the_rail_kept_is_voided_there(acme_api, rails):
    intent = refused_but_kept(acme_api, rails, 1777)
    charge_id = intent["charge"]["id"]
    assert scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [f"charge:void:{charge_id}"]) == 1
    run_worker_until(lambda: voids_at_rail(rails, charge_id))
    assert rails.charge(charge_id)["settled"] == "canceled"  # no payer can pay it now
    wait_for(lambda: scalar("SELECT count(*) FROM jobs WHERE dedupe_key = %s", [f"charge:void:{charge_id}"]) == 0)
    assert Charge.objects.get(pk=charge_id).status == "failed"


def test_a_success_the_rail_reports_instead_is_recorded_and_paged(acme_api, rails):
    intent = refused_but_kept(acme_api, rails, 1888)
    charge_id = intent["charge"]["id"]
    # The rail settled it meanwhile (asked by anyone: its answer is final).
    polled = httpx.get(f"{rails.url}/push/charges/{charge_id}", headers={"Authorization": f"Bearer {API_KEY}"})
    assert polled.json()["status"] == "succeeded"
    run_worker_until(lambda: Charge.objects.get(pk=charge_id).status == "succeeded")
    charge = Charge.objects.get(pk=charge_id)
    assert charge.amount_captured == 1888 and intent_status(intent["id"]) == "failed"
    assert scalar("SELECT severity FROM alerts WHERE key = %s", [f"charge_late_success:{charge_id}:0"]) == "page"


def test_a_dead_redirect_order_is_voided_at_the_rail(acme_api, rails):
    rails.scenario(amount=1999, drop_submits=1)  # the rail takes the order; its answer is lost
    intent = acme_api.confirm(acme_api.intent(amount=1999, rail="sandbox_redirect")["id"])
    charge_id = intent["charge"]["id"]
    assert intent["charge"]["status"] == "submitting"
    time.sleep(1.6)  # past the not-found window: the poll may conclude nobody was handed a URL
    queue.pull_forward(f"charge:poll:{charge_id}")  # not after this fixture's 30 s confirm grace
    run_worker_until(lambda: voids_at_rail(rails, charge_id))
    charge = Charge.objects.get(pk=charge_id)
    assert (charge.status, charge.failure_code) == ("failed", "redirect_never_delivered")
    assert rails.charge(charge_id)["settled"] == "canceled"
