"""The webhook delivery state machine under Hypothesis, against the real database.

Every rule drives the real code path, with no receiver anywhere (fan-out, begin, record,
a real perform against a port nobody listens on, lease expiry, recovery and backstop,
endpoint add/delete/disable/enable, an operator's resend, time passing); after every step
each delivery and attempt row is compared with what it was: every change must be an edge
of docs/architecture.md §8 that the rule may cause. The invariants are listed, with what
each rule does, in docs/rehearsals.md ("State machines under Hypothesis").
"""

from __future__ import annotations

import hashlib

import pytest
from django.db import transaction
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from merchants.services import create_merchant
from tests.state_machine_support import FAST, HEAVY, check_edges, sql, truncate
from tests.webhook_support import free_port
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.models import Event, WebhookEndpoint
from webhooks.services import delivery, endpoints, fanout, scan
from webhooks.services.endpoint_health import endpoint_disable, endpoint_enable
from webhooks.services.resend import TERMINAL, resend_delivery
from webhooks.ssrf import parse_cidrs

pytestmark = pytest.mark.django_db(transaction=True)

P, D, S, X, R, C = "pending", "delivering", "succeeded", "exhausted", "refused", "cancelled"
IN_FLIGHT = "in_flight"
SCHEDULE = (0.0, 3600.0)  # three tries per ladder; the third waits an hour (time_passes makes it due)
TRIES = len(SCHEDULE) + 1

# docs/architecture.md §8, as written there.
DELIVERY_TABLE = {
    (None, P),  # a fan-out
    (P, D),
    (D, S),
    (D, P),  # the next rung (a failure, or an expired lease recovered)
    (D, X),
    (D, R),
    (P, C),
    (D, C),
    (X, P),  # an operator's resend (a fresh ladder)
    (R, P),
    (S, P),  # a resend of a succeeded delivery, when the operator asks for it
}
ATTEMPT_TABLE = {
    (None, IN_FLIGHT),
    (IN_FLIGHT, "succeeded"),
    (IN_FLIGHT, "failed"),
    (IN_FLIGHT, "no_response"),
    (IN_FLIGHT, "abandoned"),
    (IN_FLIGHT, "stale"),
}
# What each rule may do (a subset of the table, checked below).
DELIVERY_EDGES = {
    "emit": set(),
    "fan_out": {(None, P)},
    # a lease taken; a pending delivery of a deleted endpoint cancelled; an expired lease
    # recovered on the way (then, if pending and due, a new lease: no visible change)
    "begin": {(P, D), (P, C), (D, P), (D, X), (D, C)},
    "record": {(D, S), (D, P), (D, X), (D, R), (D, C)},
    "recover": {(D, P), (D, X), (D, C)},
    "resend": {(X, P), (R, P), (S, P)},
    "delete": {(P, C)},
}
ATTEMPT_EDGES = {
    "begin": {(None, IN_FLIGHT), (IN_FLIGHT, "abandoned")},
    "record": {(IN_FLIGHT, s) for s in ("succeeded", "failed", "no_response", "stale")},
    "recover": {(IN_FLIGHT, "abandoned")},
}
ANSWERS = {
    # attempt state, delivery state decided before sending, status heard
    "success": ("succeeded", None, 200),
    "refusal": ("failed", None, 500),
    "no_response": ("no_response", None, None),
    "ssrf_refused": ("failed", R, None),
}
DIGESTS = ["body", None, "other"]


def deliveries() -> dict[int, str]:
    """Each delivery's state, in an order that does not depend on ids drawn at random
    (endpoint and event ids are): rules pick by position, and Hypothesis must see the same
    machine when it replays the same choices."""
    return dict(
        sql(
            "SELECT d.id, d.state FROM webhook_deliveries d JOIN events ev ON ev.id = d.event_id"
            " JOIN webhook_endpoints ep ON ep.id = d.endpoint_id ORDER BY ev.created_at, ep.created_at"
        )
    )


def attempts() -> dict[int, str]:
    return dict(sql("SELECT id, state FROM webhook_delivery_attempts"))


def delivery_row(delivery_id: int) -> list[tuple]:
    return sql("SELECT * FROM webhook_deliveries WHERE id = %s", [delivery_id])


def digest_of(delivery_id: int) -> str:
    event = Event.objects.get(deliveries__id=delivery_id)
    return hashlib.sha256(delivery.render_body(event)).hexdigest()


class DeliveryMachine(RuleBasedStateMachine):
    merchant = None  # set by the fixture: one merchant for every example

    def __init__(self) -> None:
        super().__init__()
        truncate("webhook_delivery_attempts", "webhook_deliveries", "events", "webhook_secrets", "webhook_endpoints")
        truncate("alerts", "jobs")
        self.url = f"http://127.0.0.1:{free_port()}/hook"  # nobody listens: a refused connection
        self.endpoints: list[str] = []
        for _ in range(2):
            self.create_endpoint()
        self.held: list = []  # leases the "workers" hold, recorded or not yet
        self.digests: dict[int, str] = {}
        self.emitted = 0
        self.deliveries, self.attempts = deliveries(), attempts()

    @initialize()
    def a_first_event_fanned_out(self):
        self.emit_event()
        self.fan_out()

    def _step(self, rule_name: str) -> None:
        new_deliveries, new_attempts = deliveries(), attempts()
        check_edges("delivery", self.deliveries, new_deliveries, DELIVERY_EDGES.get(rule_name, set()), rule_name)
        check_edges("attempt", self.attempts, new_attempts, ATTEMPT_EDGES.get(rule_name, set()), rule_name)
        self.deliveries, self.attempts = new_deliveries, new_attempts

    def _pick(self, i: int, states: tuple[str, ...] | None = None) -> int | None:
        ids = [k for k, v in self.deliveries.items() if states is None or v in states]
        return ids[i % len(ids)] if ids else None

    def create_endpoint(self) -> None:
        with transaction.atomic():
            endpoint, _secret = endpoints.create_endpoint(self.merchant, url=self.url, enabled_events=["*"])
        self.endpoints.append(endpoint.pk)

    @precondition(lambda self: len(self.endpoints) < 3)
    @rule()
    def add_endpoint(self):
        self.create_endpoint()
        self._step("add_endpoint")

    @precondition(lambda self: self.emitted < 4)  # a few deliveries, each taken further
    @rule()
    def emit_event(self):
        with transaction.atomic():
            emit(self.merchant, EventType.CUSTOMER_DELETED, {"id": f"cus_{self.emitted}", "object": "customer"})
        self.emitted += 1
        self._step("emit")

    @precondition(lambda self: sql("SELECT EXISTS (SELECT FROM events WHERE fan_out = 'pending')") == [(True,)])
    @rule()
    def fan_out(self):
        """The drain; every pending event gets one delivery per live, enabled endpoint
        (not the one a ``webhook_endpoint.*`` event is about)."""
        live = {e for (e,) in sql("SELECT id FROM webhook_endpoints WHERE deleted_at IS NULL AND disabled_at IS NULL")}
        pending = sql("SELECT id, type, data->>'id' FROM events WHERE fan_out = 'pending'")
        fanout.drain_once()
        for event_id, event_type, about in pending:
            made = {e for (e,) in sql("SELECT endpoint_id FROM webhook_deliveries WHERE event_id = %s", [event_id])}
            expected = live - {about} if event_type.startswith("webhook_endpoint.") else live
            assert made == expected, f"event {event_id} fanned out to {made}, not {expected}"
        assert sql("SELECT count(*) FROM events WHERE fan_out <> 'fanned_out'") == [(0,)]
        self._step("fan_out")

    @precondition(lambda self: P in self.deliveries.values() or D in self.deliveries.values())
    @rule(i=st.integers(0, 1000))
    def begin(self, i):
        lease = self._begin(self._pick(i, (P, D)))
        if lease is not None:
            self.held.append(lease)

    def _begin(self, delivery_id: int):
        before = delivery_row(delivery_id)
        disabled = sql(
            "SELECT e.disabled_at IS NOT NULL FROM webhook_deliveries d JOIN webhook_endpoints e"
            " ON e.id = d.endpoint_id WHERE d.id = %s",
            [delivery_id],
        ) == [(True,)]
        begun = delivery.begin_attempt(delivery_id)
        assert not (disabled and begun.lease), "an attempt began for a disabled endpoint"
        if self.deliveries[delivery_id] == P and begun.kind not in (delivery.Begin.CLAIMED, delivery.Begin.GONE):
            # Held (a disabled endpoint), not due, at the cap: nothing written, no rung spent
            # (a deleted endpoint's is cancelled: GONE).
            assert delivery_row(delivery_id) == before, f"a {begun.kind} begin wrote something"
        self._step("begin")
        return begun.lease

    @precondition(lambda self: self.held)
    @rule(j=st.integers(0, 1000), answer=st.sampled_from(sorted(ANSWERS)), digest=st.sampled_from(DIGESTS))
    def record(self, j, answer, digest):
        """An answer for an attempt a worker held, whether its lease is still the delivery's
        or not (a late finisher). ``digest``: of the body sent, none (nothing left the
        process), or of a different body: the first one stored must stay."""
        self._answer(self.held.pop(j % len(self.held)), answer, digest)

    @precondition(lambda self: P in self.deliveries.values())
    @rule(i=st.integers(0, 1000), answer=st.sampled_from(sorted(ANSWERS)), digest=st.sampled_from(DIGESTS))
    def whole_attempt(self, i, answer, digest):
        """A worker that begins and hears an answer with nothing in between: what most
        attempts are, and the quick way down a ladder."""
        lease = self._begin(self._pick(i, (P,)))
        if lease is not None:
            self._answer(lease, answer, digest)

    def _answer(self, lease, answer: str, digest: str | None) -> None:
        attempt_state, delivery_state, status = ANSWERS[answer]
        sha = {"body": digest_of(lease.delivery_id), None: None, "other": "0" * 64}[digest]
        self._record(lease, delivery.Attempted(attempt_state, delivery_state, status, payload_sha256=sha))

    @precondition(lambda self: self.held)
    @rule(j=st.integers(0, 1000))
    def perform_against_nothing(self, j):
        """The real perform: a refused connection (no response), or nothing sent at all
        when the endpoint was deleted meanwhile."""
        lease = self.held.pop(j % len(self.held))
        self._record(lease, delivery.perform(lease))

    def _record(self, lease, attempted) -> None:
        ours = sql(
            "SELECT lease_token = %s AND lease_expires_at > now() FROM webhook_deliveries WHERE id = %s",
            [lease.token, lease.delivery_id],
        ) == [(True,)]
        before = delivery_row(lease.delivery_id)
        recorded = delivery.record(lease, attempted)
        assert recorded.stale is not ours, (
            f"a record whose lease was {'ours' if ours else 'gone'} said stale={recorded.stale}"
        )
        if not ours:
            assert delivery_row(lease.delivery_id) == before, "a late finisher changed its delivery"
        self._step("record")

    @precondition(lambda self: D in self.deliveries.values())
    @rule(i=st.integers(0, 1000))
    def lease_runs_out(self, i):
        """The worker stalls or dies: its lease expires, on the database clock."""
        sql(
            "UPDATE webhook_deliveries SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            [self._pick(i, (D,))],
        )
        self._step("lease_runs_out")

    @precondition(lambda self: D in self.deliveries.values())
    @rule(i=st.integers(0, 1000))
    def recover_one(self, i):
        delivery_id = self._pick(i, (D,))
        live = sql("SELECT lease_expires_at > now() FROM webhook_deliveries WHERE id = %s", [delivery_id]) == [(True,)]
        before = delivery_row(delivery_id)
        state = delivery.recover_expired(delivery_id)
        if live:  # a live lease is never taken from its worker
            assert state is None and delivery_row(delivery_id) == before, "recovered a live lease"
        self._step("recover")

    @precondition(lambda self: D in self.deliveries.values())
    @rule()
    def backstop(self):
        scan.scan_once(overdue_seconds=0)
        self._step("recover")

    @precondition(lambda self: {S, X, R} & set(self.deliveries.values()))
    @rule(i=st.integers(0, 1000), include_succeeded=st.booleans())
    def resend(self, i, include_succeeded):
        delivery_id = self._pick(i, (S, X, R))
        states = (*TERMINAL, S) if include_succeeded else TERMINAL
        resent = resend_delivery(delivery_id, actor=None, states=states, reason="the merchant asked")
        assert resent == (self.deliveries[delivery_id] in states)
        self._step("resend")

    @precondition(lambda self: len(self.endpoints) > 1)  # one stays, to deliver to
    @rule(k=st.integers(0, 1000))
    def delete_endpoint(self, k):
        endpoint_id = self.endpoints.pop(k % len(self.endpoints))
        with transaction.atomic():
            endpoints.delete_endpoint(WebhookEndpoint.objects.get(pk=endpoint_id))
        self._step("delete")

    @precondition(lambda self: self.endpoints)
    @rule(k=st.integers(0, 1000), enable=st.booleans())
    def disable_or_enable(self, k, enable):
        endpoint_id = self.endpoints[k % len(self.endpoints)]
        if enable:
            endpoint_enable(endpoint_id=endpoint_id, actor="hypothesis")
        else:
            endpoint_disable(endpoint_id=endpoint_id, reason="rehearsal", actor="hypothesis")
        self._step("disable_or_enable")

    @precondition(
        lambda self: (
            sql("SELECT EXISTS (SELECT FROM webhook_deliveries WHERE state = 'pending' AND next_attempt_at > now())")
            == [(True,)]
        )
    )
    @rule()
    def time_passes(self):
        sql("UPDATE webhook_deliveries SET next_attempt_at = now() WHERE state = 'pending' AND next_attempt_at > now()")
        self._step("time_passes")

    @invariant()
    def attempts_and_evidence_are_whole(self):
        # Attempts numbered 1..n without gaps, n being the delivery's count.
        gaps = sql(
            "SELECT d.id, d.attempts, array_agg(a.number ORDER BY a.number) FILTER (WHERE a.id IS NOT NULL)"
            " FROM webhook_deliveries d LEFT JOIN webhook_delivery_attempts a ON a.delivery_id = d.id GROUP BY d.id"
            " HAVING coalesce(array_agg(a.number ORDER BY a.number) FILTER (WHERE a.id IS NOT NULL), '{}')"
            " <> ARRAY(SELECT generate_series(1, d.attempts))"
        )
        assert not gaps, f"attempt numbers with gaps: {gaps}"
        # In flight: at most one per delivery, only the one holding its lease; a live lease
        # always has its attempt in flight.
        assert (
            sql(
                "SELECT a.id FROM webhook_delivery_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id"
                " WHERE a.state = 'in_flight' AND (d.state <> 'delivering' OR d.lease_token <> a.lease_token)"
            )
            == []
        )
        assert (
            sql(
                "SELECT d.id FROM webhook_deliveries d WHERE d.state = 'delivering' AND d.lease_expires_at > now()"
                " AND (SELECT count(*) FROM webhook_delivery_attempts a WHERE a.delivery_id = d.id"
                " AND a.state = 'in_flight' AND a.lease_token = d.lease_token) <> 1"
            )
            == []
        )
        # Succeeded: exactly one succeeded attempt on the current ladder; anything else none.
        wrong = sql(
            "SELECT d.id, d.state, count(a.id) FROM webhook_deliveries d LEFT JOIN webhook_delivery_attempts a"
            " ON a.delivery_id = d.id AND a.state = 'succeeded' AND a.number > d.ladder_base GROUP BY d.id"
            " HAVING count(a.id) <> CASE WHEN d.state = 'succeeded' THEN 1 ELSE 0 END"
        )
        assert not wrong, f"succeeded attempts on the current ladder: {wrong}"
        # The ladder: never past its tries; exhausted only once it ran out.
        assert (
            sql(
                "SELECT id FROM webhook_deliveries WHERE attempts - ladder_base > %s"
                " OR (state = 'exhausted' AND attempts - ladder_base <> %s)",
                [TRIES, TRIES],
            )
            == []
        )
        # The digest: once set, never changed.
        for delivery_id, sha in sql(
            "SELECT id, payload_sha256 FROM webhook_deliveries WHERE payload_sha256 IS NOT NULL"
        ):
            assert self.digests.setdefault(delivery_id, sha) == sha, f"delivery {delivery_id}: payload_sha256 changed"
        assert set(self.digests) <= {
            d for (d,) in sql("SELECT id FROM webhook_deliveries WHERE payload_sha256 IS NOT NULL")
        }
        # A finished delivery says when, a cancelled one why; an exhausted or refused one
        # is in front of a human (its endpoint's alert of that kind: one per period, counted).
        assert (
            sql(
                "SELECT id FROM webhook_deliveries WHERE (completed_at IS NULL) <> (state IN ('pending', 'delivering'))"
                " OR (state = 'cancelled' AND cancel_reason = '')"
            )
            == []
        )
        unalerted = sql(
            "SELECT d.id, d.state FROM webhook_deliveries d WHERE d.state IN ('exhausted', 'refused')"
            " AND NOT EXISTS (SELECT 1 FROM alerts a WHERE starts_with(a.key,"
            " CASE d.state WHEN 'exhausted' THEN 'webhook_endpoint_exhausted:' ELSE 'webhook_endpoint_refused:' END"
            " || d.endpoint_id || ':'))"
        )
        assert not unalerted, f"failed deliveries no human was told about: {unalerted}"


@pytest.fixture
def machine_settings(settings):
    settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")
    settings.VPAY_WEBHOOK_RETRY_SCHEDULE = SCHEDULE
    settings.VPAY_WEBHOOK_LEASE_SECONDS = 30.0  # leases run out only when a rule says so
    settings.VPAY_WEBHOOK_CONNECT_TIMEOUT = 0.5
    settings.VPAY_WEBHOOK_TIMEOUT = 1.0
    DeliveryMachine.merchant, _ = create_merchant("Acme")
    yield
    DeliveryMachine.merchant = None


def test_each_rule_moves_only_along_the_tables_of_architecture_md():
    for rule_name, edges in DELIVERY_EDGES.items():
        assert edges <= DELIVERY_TABLE, rule_name
    for rule_name, edges in ATTEMPT_EDGES.items():
        assert edges <= ATTEMPT_TABLE, rule_name


def test_the_delivery_state_machine_moves_only_along_its_table(machine_settings):
    run_state_machine_as_test(DeliveryMachine, settings=FAST)


@pytest.mark.rehearse
def test_rehearsal__the_delivery_state_machine_with_a_large_budget(machine_settings):
    run_state_machine_as_test(DeliveryMachine, settings=HEAVY)


def test_a_late_finisher_changes_nothing_and_the_first_digest_stays(machine_settings):
    # The races the machine looks for, spelled out once (the normal budget may not reach
    # them): a failure stores the digest of the body sent; the next attempt's lease runs
    # out, its late answer (a success, even) is discarded and its attempt marked stale,
    # which the recovery then keeps; a later attempt reporting another digest stores none.
    machine = DeliveryMachine()
    machine.a_first_event_fanned_out()
    for step in (
        lambda: machine.whole_attempt(i=0, answer="refusal", digest="body"),
        lambda: machine.begin(i=0),
        lambda: machine.lease_runs_out(i=0),
        lambda: machine.record(j=0, answer="success", digest="other"),
        lambda: machine.recover_one(i=0),
        lambda: machine.whole_attempt(i=0, answer="success", digest="other"),
    ):
        step()
        machine.attempts_and_evidence_are_whole()
    first = next(iter(machine.deliveries))
    assert sql(
        "SELECT d.state, d.payload_sha256, array_agg(a.state ORDER BY a.number) FROM webhook_deliveries d"
        " JOIN webhook_delivery_attempts a ON a.delivery_id = d.id WHERE d.id = %s GROUP BY d.id",
        [first],
    ) == [("succeeded", digest_of(first), ["failed", "stale", "succeeded"])]
    machine.teardown()


def test_a_disabled_endpoint_holds_its_deliveries_and_enabling_it_resumes_them(machine_settings):
    machine = DeliveryMachine()
    machine.a_first_event_fanned_out()
    machine.disable_or_enable(k=0, enable=False)
    held = next(iter(machine.deliveries))
    machine.whole_attempt(i=0, answer="success", digest="body")  # held: nothing begins, no rung spent
    assert machine.deliveries[held] == P and machine.attempts == {}
    machine.disable_or_enable(k=0, enable=True)
    machine.whole_attempt(i=0, answer="success", digest="body")
    assert machine.deliveries[held] == S
    machine.attempts_and_evidence_are_whole()
    machine.teardown()
