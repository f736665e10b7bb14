"""A payment's life in events (issue 24 §4): each change a merchant acts on has its event,
written in the transaction of the change, its body as the API renders the object minus what
only the payer's browser may hold. Against the real database and the sandbox rail."""

from __future__ import annotations

import pytest

from charges import refund_repository
from charges.services.refunds import refund_fail, refund_succeed
from tests.charges_support import events
from tests.factories import RefundFactory

pytestmark = pytest.mark.django_db(transaction=True)


def types(object_id: str) -> list[str]:
    """In commit order (the events of one transaction share its now(): their order among
    themselves is not kept)."""
    return [t for t, _ in events(object_id, progress=True)]


def settled_types(object_id: str) -> tuple[str, list[str]]:
    """A refund's first event, and the sorted events of the transaction that settled it."""
    first, *rest = types(object_id)
    return first, sorted(rest)


def test_an_intent_created_then_confirmed_on_a_push_rail(acme_api):
    intent = acme_api.intent(amount=1500)
    assert types(intent["id"]) == ["payment_intent.created"]
    created = events(intent["id"], progress=True)[0][1]
    assert (created["status"], created["amount"], created["charge"]) == ("requires_confirmation", 1500, None)
    acme_api.confirm(intent["id"])
    assert types(intent["id"]) == ["payment_intent.created", "payment_intent.processing"]
    processing = events(intent["id"], "payment_intent.processing")[0][1]
    assert processing["status"] == "processing" and processing["charge"]["status"] == "submitting"


def test_a_redirect_rail_adds_requires_action_without_the_payers_url(acme_api):
    intent = acme_api.intent(amount=1500, rail="sandbox_redirect")
    confirmed = acme_api.confirm(intent["id"])
    assert confirmed["status"] == "requires_action" and confirmed["next_action"]["redirect_url"]
    assert types(intent["id"]) == [
        "payment_intent.created",
        "payment_intent.processing",
        "payment_intent.requires_action",
    ]
    body = events(intent["id"], "payment_intent.requires_action")[0][1]
    assert body["status"] == "requires_action"
    assert body["redirect_url"] is None and body["next_action"] is None and body["charge"]["redirect_url"] is None


def test_a_checkout_session_creates_its_intent_with_its_event(acme_api):
    session = acme_api.call(
        "POST", "/v1/checkout/sessions", {"amount": 700, "currency": "usd", "rail": "sandbox_push"}
    ).json()
    assert types(session["payment_intent"]) == ["payment_intent.created"]


def test_a_refund_is_created_then_updated_with_its_outcome_and_the_charge_refunded(acme_api):
    refund = RefundFactory(intent__merchant=acme_api.merchant, amount=300)
    assert types(refund.id) == ["refund.created"]
    assert events(refund.id, progress=True)[0][1]["status"] == "submitting"
    assert refund_succeed(row=refund_repository.read_for_poll(refund.id))
    assert settled_types(refund.id) == ("refund.created", ["refund.succeeded", "refund.updated"])
    assert events(refund.id, "refund.updated")[0][1]["status"] == "succeeded"
    charge_events = events(refund.charge_id, "charge.refunded")
    assert len(charge_events) == 1 and charge_events[0][1]["id"] == refund.charge_id
    # Settled once: a second answer writes nothing more.
    assert not refund_succeed(row=refund_repository.read_for_poll(refund.id))
    assert len(events(refund.id, progress=True)) == 3


def test_a_failed_refund_is_updated_and_leaves_the_charge_unrefunded(acme_api):
    refund = RefundFactory(intent__merchant=acme_api.merchant, amount=300)
    assert refund_fail(row=refund_repository.read_for_poll(refund.id), failure_code="declined")
    assert settled_types(refund.id) == ("refund.created", ["refund.failed", "refund.updated"])
    assert events(refund.charge_id, "charge.refunded") == []


def test_every_lifecycle_type_is_listed_by_event_types(acme_api):
    listed = {t["type"] for t in acme_api.call("GET", "/v1/event_types").json()["data"]}
    assert {
        "payment_intent.created",
        "payment_intent.processing",
        "payment_intent.requires_action",
        "charge.refunded",
        "refund.created",
        "refund.updated",
    } <= listed
