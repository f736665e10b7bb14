"""The charge and intent state machines under Hypothesis, against the real database.

Rules drive the real services: a charge left ``submitting`` (what the confirm's first
commit leaves), the confirm's compare-and-swap (``repository.mark_submitted``), a worker
reading the charge (``repository.read_for_poll``) and, later, an answer arriving for what
it read — possibly stale by then — through the settlement table and the transitions
service, exactly as ``poll_charge`` applies it; a dead redirect order
(``transitions.fail_submitting``). After every step each charge and intent is compared
with what it was: every change must be an edge of docs/architecture.md §8, and each
intent has exactly one settlement event once settled, never two.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from charges import repository
from charges.models import Charge, PaymentIntent
from charges.services import transitions
from charges.settlement import Settlement, settle
from charges.states import RailStatus
from merchants.services import create_merchant
from tests.state_machine_support import FAST, HEAVY, check_edges, sql, truncate

pytestmark = pytest.mark.django_db(transaction=True)

CHARGE_EDGES = {
    (None, "submitting"),
    ("submitting", "submitted"),
    ("submitted", "succeeded"),
    ("submitted", "failed"),
    ("submitted", "unresolved"),
    ("unresolved", "succeeded"),
    ("unresolved", "failed"),
    ("submitting", "failed"),
    ("submitting", "unresolved"),
    # through submitted, in the settlement's own transaction (observed as one change)
    ("submitting", "succeeded"),
}
INTENT_EDGES = {
    (None, "processing"),
    ("processing", "requires_action"),
    ("processing", "succeeded"),
    ("processing", "failed"),
    ("requires_action", "succeeded"),
    ("requires_action", "failed"),
    ("requires_action", "processing"),
}
ANSWERS = [RailStatus.SUCCEEDED, RailStatus.FAILED, RailStatus.PENDING, RailStatus.NOT_FOUND, RailStatus.UNAVAILABLE]


def charges() -> dict[str, str]:
    return dict(sql("SELECT id, status FROM charges"))


def intents() -> dict[str, str]:
    return dict(sql("SELECT id, status FROM payment_intents"))


class ChargeMachine(RuleBasedStateMachine):
    merchant = None  # set by the test: one merchant for every example

    def __init__(self) -> None:
        super().__init__()
        truncate("provider_requests", "checkout_sessions", "charges", "payment_intents", "events", "alerts", "jobs")
        self.reads: list[repository.ChargeRow] = []
        self.charges, self.intents = charges(), intents()

    def _step(self, rule_name: str) -> None:
        new_charges, new_intents = charges(), intents()
        check_edges("charge", self.charges, new_charges, CHARGE_EDGES, rule_name)
        check_edges("intent", self.intents, new_intents, INTENT_EDGES, rule_name)
        self.charges, self.intents = new_charges, new_intents

    @rule(flow=st.sampled_from(["push", "redirect"]))
    def create(self, flow):
        rail = f"sandbox_{flow}"
        intent = PaymentIntent.objects.create(
            merchant=self.merchant, amount=100, currency="usd", rail=rail, status="processing"
        )
        Charge.objects.create(intent=intent, merchant=self.merchant, rail=rail, flow=flow, amount=100, currency="usd")
        self._step("create")

    @precondition(lambda self: self.charges)
    @rule(i=st.integers(0, 1000))
    def confirm_swap(self, i):
        charge_id = sorted(self.charges)[i % len(self.charges)]
        repository.mark_submitted(charge_id, pay_token="tok", redirect_url=None)
        self._step("confirm_swap")

    @precondition(lambda self: self.charges)
    @rule(i=st.integers(0, 1000))
    def worker_reads(self, i):
        self.reads.append(repository.read_for_poll(sorted(self.charges)[i % len(self.charges)]))
        self._step("read")

    @precondition(lambda self: self.reads)
    @rule(j=st.integers(0, 1000), answer=st.sampled_from(ANSWERS), past=st.booleans())
    def answer_arrives(self, j, answer, past):
        """What poll_charge does with a rail answer about the charge as it read it."""
        row = self.reads[j % len(self.reads)]
        outcome = settle(row.status, answer, past_horizon=past)
        if outcome is Settlement.SUCCEED:
            transitions.succeed(row)
        elif outcome is Settlement.FAIL:
            transitions.fail(row, "declined")
        elif outcome is Settlement.ESCALATE:
            transitions.escalate_to_unresolved(row, "past the horizon", alert_period=3600.0)
        elif outcome is Settlement.MARK_SUBMITTED:
            repository.mark_submitted(row.id, pay_token=None, redirect_url=None)
        self._step("answer")

    @precondition(lambda self: self.reads)
    @rule(j=st.integers(0, 1000))
    def dead_order(self, j):
        row = self.reads[j % len(self.reads)]
        transitions.fail_submitting(row.id, row.intent_id, transitions.DEAD_ORDER, rail=row.rail)
        self._step("dead_order")

    @invariant()
    def settled_once_and_told_once(self):
        events = sql(
            "SELECT data->>'id', type, count(*) FROM events WHERE type IN"
            " ('payment_intent.succeeded', 'payment_intent.payment_failed') GROUP BY 1, 2"
        )
        told = {intent_id: (event_type, n) for intent_id, event_type, n in events}
        assert len(told) == len(events), f"an intent was told two different endings: {events}"
        by_intent = dict(sql("SELECT intent_id, status FROM charges"))
        for intent_id, status in self.intents.items():
            charge = by_intent[intent_id]
            if status == "succeeded":
                assert charge == "succeeded" and told.get(intent_id) == ("payment_intent.succeeded", 1)
            elif status == "failed":
                assert charge == "failed" and told.get(intent_id) == ("payment_intent.payment_failed", 1)
            else:
                assert charge not in ("succeeded", "failed") and intent_id not in told
        unresolved = sql(
            "SELECT count(*) FROM events WHERE type = 'charge.unresolved' GROUP BY data->>'id' HAVING count(*) > 1"
        )
        assert not unresolved, "charge.unresolved told twice"


@pytest.fixture
def merchant():
    merchant, _ = create_merchant("Acme")
    ChargeMachine.merchant = merchant
    yield merchant
    ChargeMachine.merchant = None


def test_the_charge_and_intent_state_machines_move_only_along_their_tables(merchant):
    run_state_machine_as_test(ChargeMachine, settings=FAST)


@pytest.mark.rehearse
def test_rehearsal__the_charge_state_machines_with_a_large_budget(merchant):
    run_state_machine_as_test(ChargeMachine, settings=HEAVY)


def test_two_workers_answered_succeeded_about_one_charge_settle_it_once(merchant):
    # The race the machine looks for, spelled out once: two reads of one submitted charge
    # (two polls), each then hearing "succeeded".
    machine = ChargeMachine()
    machine.create(flow="push")
    machine.confirm_swap(i=0)
    machine.worker_reads(i=0)
    machine.worker_reads(i=0)
    machine.answer_arrives(j=0, answer=RailStatus.SUCCEEDED, past=False)
    machine.answer_arrives(j=1, answer=RailStatus.SUCCEEDED, past=False)
    machine.settled_once_and_told_once()
    machine.teardown()
