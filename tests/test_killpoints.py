"""Kill anywhere: a real ``runworker`` SIGKILLs itself at a named point of the money path
(``vpay.faultpoints``, armed by ``tests/fault_injection.py`` through a test-only
``sitecustomize``), a replacement finishes, and the invariants are read from the
database, the sandbox rail's own request log and the receiver's own record.

The backlog: charges confirmed through the API (the worker polls them), charges left as a
crash right after the confirm's first commit leaves them (the worker resubmits them: a
rail submit from the worker), their settlement events fanned out to two endpoints and
delivered to the receiver. The fast cases run in ``make test``; the heavy ones (a larger
backlog, kills mid-backlog, a chain of kills) are marked ``rehearse``.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter

import pytest
from django.db import transaction

from tests.charges_support import (
    FAST_POLICY,
    PROGRESS_EVENTS,
    Merchant,
    apply_policy,
    scalar,
    sql,
    use_rails,
    worker_env,
)
from tests.conftest import wait_for
from tests.factories import ChargeFactory
from tests.killpoints_support import kill_env
from webhooks.event_types import EventType
from webhooks.events import emit
from webhooks.services import endpoints
from webhooks.ssrf import parse_cidrs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WEBHOOK_ENV = {
    "VPAY_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
    "VPAY_WEBHOOK_FAN_OUT_IDLE": "0.2",
    "VPAY_WEBHOOK_SCAN_PERIOD": "1",
    "VPAY_WEBHOOK_CONNECT_TIMEOUT": "0.5",
    "VPAY_WEBHOOK_TIMEOUT": "1",
    "VPAY_WEBHOOK_LEASE_SECONDS": "2",
    "VPAY_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2,0.2,0.2",
}
MAX_DELIVERY_ATTEMPTS = len(WEBHOOK_ENV["VPAY_WEBHOOK_RETRY_SCHEDULE"].split(",")) + 1
MONEY_PATH_KINDS = ["poll_charge", "resubmit_charge", "webhook_deliver"]
WORKER_ARGS = ("--concurrency", "4", "--heartbeat", "0.25")

# Each point of vpay.faultpoints, with the subject and the nth reach the fast case kills at.
FAST_CASES = [
    "job.claimed@poll_charge:2",
    "job.ran@poll_charge:1",
    "job.ran@webhook_deliver:1",
    "rail.request_recorded@status:2",
    "rail.request_recorded@submit:1",
    "rail.answered@status:2",
    "rail.answered@submit:1",
    "webhook.attempt_recorded:2",
    "webhook.carried:1",
    "webhook.answered@succeeded:2",
    "fan_out.event_committed:1",
    "fan_out.deliveries_written:1",
]


# The events whose deliveries these rehearsals count: the outcomes (a payment's progress
# events are fanned out too, to no endpoint here).
OUTCOMES = ["payment_intent.succeeded", "customer.deleted"]


class MoneyPath:
    """Rails on the sandbox, a receiver with two endpoints, and the worker's environment."""

    def __init__(self, settings, tmp_path, rail, receiver, start_worker) -> None:
        self.tmp_path, self.rail, self.receiver, self._start = tmp_path, rail, receiver, start_worker
        rails_file = use_rails(settings, tmp_path, rail.rails())
        apply_policy(settings, FAST_POLICY)
        settings.VPAY_WEBHOOK_ALLOW_CIDRS = parse_cidrs("127.0.0.1/32")
        self.env = {**worker_env(rails_file, FAST_POLICY), **WEBHOOK_ENV}
        self.acme = Merchant("Acme")
        self.paths = ["/a", "/b"]
        for path in self.paths:
            _, secret = endpoints.create_endpoint(self.acme.merchant, url=receiver.url(path), enabled_events=OUTCOMES)
            receiver.add_secrets(secret)
        self.intents: list[str] = []
        self.extra_events = 0

    def backlog(self, *, confirmed: int, crashed: int, events: int = 0) -> None:
        """``confirmed`` intents confirmed through the API (submitted; the worker polls),
        ``crashed`` left as a crash after the confirm's first commit (submitting, no request
        row; the worker resubmits), and ``events`` emitted directly (a fan-out backlog)."""
        for i in range(confirmed):
            intent = self.acme.confirm(self.acme.intent(amount=5000 + i)["id"])
            self.intents.append(intent["id"])
        for i in range(crashed):
            self.intents.append(crashed_before_the_post(self.acme.merchant, 6000 + i))
        with transaction.atomic():
            for i in range(events):
                emit(self.acme.merchant, EventType.CUSTOMER_DELETED, {"id": f"cus_{i}", "object": "customer"})
        self.extra_events += events

    def worker(self, worker_id: str, kill_at: str | None = None):
        env = {**self.env, **kill_env(self.tmp_path, kill_at)}
        return self._start(*WORKER_ARGS, "--worker-id", worker_id, env=env)

    def done(self) -> bool:
        expected_events = len(self.intents) + self.extra_events
        return (
            scalar("SELECT count(*) FROM charges WHERE status <> 'succeeded'") == 0
            and scalar("SELECT count(*) FROM events WHERE fan_out = 'fanned_out' AND type = ANY(%s)", [OUTCOMES])
            == expected_events
            and scalar("SELECT count(*) FROM webhook_deliveries WHERE state = 'succeeded'")
            == expected_events * len(self.paths)
            and scalar("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'") == 0
            # Every job of the money path finished, the dead worker's rescued ones included:
            # a re-run is where a second settlement or a second send would come from.
            and scalar("SELECT count(*) FROM jobs WHERE kind = ANY(%s)", [MONEY_PATH_KINDS]) == 0
        )


def crashed_before_the_post(merchant, amount: int) -> str:
    """The rows a crash right after the confirm's first commit leaves (push rail): intent
    processing, charge submitting, its poll job due, no provider_requests row."""
    return ChargeFactory(intent__merchant=merchant, intent__amount=amount, crashed_before_the_post=True).intent_id


def killed_at(worker, spec: str, timeout: float = 60) -> None:
    """The worker died of its own fault injection at ``spec``'s point (not of anything else)."""
    code = worker.wait(timeout=timeout)
    point = spec.split("@")[0].split(":")[0]
    assert code == -signal.SIGKILL, (code, worker.output()[-2000:])
    assert f"fault injection: SIGKILL at {point}" in worker.output()


def check_invariants(stack: MoneyPath, dead_workers: list[str]) -> None:
    """What no kill may break, from the database, the rail's log and the receiver's record."""
    # No charge settled twice: one settlement event per intent, every intent succeeded.
    per_intent = Counter(
        object_id
        for (object_id,) in sql("SELECT data->>'id' FROM events WHERE type = %s", [EventType.PAYMENT_INTENT_SUCCEEDED])
    )
    assert per_intent == Counter(stack.intents), per_intent
    assert scalar("SELECT count(*) FROM payment_intents WHERE status <> 'succeeded'") == 0
    assert (
        scalar("SELECT count(*) FROM events WHERE type <> ALL(%s)", [OUTCOMES + PROGRESS_EVENTS])
        == 0
    )
    # The rail saw every submit of a charge under its one reference (its idempotency key). A
    # submit another executor was sending when the kill landed arrives cut off mid-body: the
    # rail refuses it (400, no reference read) and holds nothing for it.
    for request in stack.rail.requests():
        if request["method"] == "POST":
            if "reference" not in request:
                assert request["status"] == 400, request
                continue
            assert request["idempotency_key"] == request["reference"], request
    # No event lost: each fanned out, each (event, endpoint) one delivery, succeeded.
    assert scalar("SELECT count(*) FROM events WHERE fan_out <> 'fanned_out'") == 0
    assert scalar("SELECT count(*) FROM webhook_deliveries WHERE state <> 'succeeded'") == 0
    event_ids = {e for (e,) in sql("SELECT id FROM events WHERE type = ANY(%s)", [OUTCOMES])}
    received = stack.receiver.received()
    # A request a kill cut off mid-body reaches the receiver unreadable (no event id): only
    # an attempt in flight at a kill can leave one, and that attempt is abandoned.
    unreadable = [r for r in received if r["event_id"] is None]
    abandoned = scalar("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'abandoned'")
    assert len(unreadable) <= abandoned, (unreadable, abandoned)
    receipts = Counter((r["path"], r["event_id"]) for r in received if r["event_id"] is not None)
    assert set(receipts) == {(p, e) for p in stack.paths for e in event_ids}
    # Duplicates only for a delivery whose attempt was in flight at a kill (abandoned) or
    # finished after its lease was taken (stale): one extra receipt per such attempt.
    cut_off = dict(
        sql(
            "SELECT e.url || '|' || d.event_id, count(*) FROM webhook_delivery_attempts a"
            " JOIN webhook_deliveries d ON d.id = a.delivery_id JOIN webhook_endpoints e ON e.id = d.endpoint_id"
            " WHERE a.state IN ('abandoned', 'stale') GROUP BY 1"
        )
    )
    for (path, event_id), n in receipts.items():
        if n > 1:
            assert n - 1 <= cut_off.get(stack.receiver.url(path) + "|" + event_id, 0), (path, event_id, n)
    assert sql(
        "SELECT count(*) FROM webhook_deliveries d WHERE (SELECT count(*) FROM webhook_delivery_attempts a"
        " WHERE a.delivery_id = d.id AND a.state = 'succeeded') <> 1"
    ) == [(0,)]
    # Attempts never above their maximum: jobs, letters, delivery ladders.
    assert scalar("SELECT count(*) FROM jobs WHERE attempts > max_attempts") == 0
    assert scalar("SELECT count(*) FROM dead_letters") == 0
    assert scalar("SELECT coalesce(max(attempts), 0) FROM webhook_deliveries") <= MAX_DELIVERY_ATTEMPTS
    # No lease left behind: nothing held by a dead worker, no attempt still in flight.
    assert scalar("SELECT count(*) FROM jobs WHERE locked_by = ANY(%s)", [dead_workers]) == 0
    assert scalar("SELECT count(*) FROM webhook_delivery_attempts WHERE state = 'in_flight'") == 0


def state_of(stack: MoneyPath) -> str:
    """What is left, for a human reading a failure: the database is flushed at teardown."""
    parts = [
        ("charges", "SELECT status, count(*) FROM charges GROUP BY 1 ORDER BY 1"),
        ("deliveries", "SELECT state, count(*) FROM webhook_deliveries GROUP BY 1 ORDER BY 1"),
        ("events", "SELECT fan_out, count(*) FROM events GROUP BY 1 ORDER BY 1"),
        (
            "jobs",
            "SELECT kind, locked_by, attempts, max_attempts, crashes, deferrals, recoveries,"
            " round(extract(epoch FROM run_at - now())::numeric, 1), left(last_error, 80)"
            " FROM jobs WHERE kind = ANY(%s) ORDER BY kind, run_at",
        ),
        ("dead letters", "SELECT kind, cause, state, attempts, left(last_error, 80) FROM dead_letters ORDER BY id"),
        ("workers", "SELECT id, extract(epoch FROM now() - heartbeat_at)::int FROM workers ORDER BY id"),
    ]
    lines = []
    for title, query in parts:
        lines.append(f"{title}:")
        lines += [f"  {row}" for row in sql(query, [MONEY_PATH_KINDS] if "%s" in query else None)]
    return "\n".join(lines)


def finished(stack: MoneyPath, dead_workers: list[str], timeout: float) -> None:
    """Wait for the replacement to finish everything, then check the invariants; if it
    never finishes, the invariants say what went wrong before the timeout does, and what
    is left is printed before the teardown flushes it."""
    try:
        wait_for(stack.done, timeout=timeout, message="the replacement to finish everything")
    except pytest.fail.Exception:
        print(state_of(stack))
        check_invariants(stack, dead_workers)
        raise
    check_invariants(stack, dead_workers)


@pytest.fixture
def stack(settings, tmp_path, sandbox_rail, receiver, start_worker):
    return MoneyPath(settings, tmp_path, sandbox_rail, receiver, start_worker)


@pytest.mark.parametrize("spec", FAST_CASES)
def test_a_worker_killed_at_a_point_leaves_work_a_replacement_finishes_exactly_once(stack, spec):
    if spec.startswith("job.ran@poll_charge"):
        # The first poll to return must be a settlement, so that the kill lands between its
        # commit and its job's acknowledgement: no crashed charge (told to wait out the
        # window first) and no more charges than a rail's share of the executors (2 of 4;
        # a third poll would defer at once).
        stack.backlog(confirmed=2, crashed=0)
    elif spec.startswith("webhook.carried"):
        # Events emitted together: each endpoint has a backlog of due deliveries to carry.
        stack.backlog(confirmed=3, crashed=2, events=10)
    else:
        stack.backlog(confirmed=3, crashed=2)
    doomed = stack.worker("doomed", kill_at=spec)
    killed_at(doomed, spec)
    stack.worker("replacement")
    finished(stack, ["doomed"], timeout=60)


# --- heavier rehearsals (make rehearse) --------------------------------------------------------

HEAVY_CASES = [
    "job.claimed@poll_charge:12",
    "job.claimed@webhook_deliver:30",
    "job.ran@poll_charge:12",
    "job.ran@webhook_deliver:30",
    "rail.request_recorded@status:15",
    "rail.request_recorded@submit:4",
    "rail.answered@status:15",
    "rail.answered@submit:4",
    "webhook.attempt_recorded:40",
    "webhook.carried:10",
    "webhook.answered@succeeded:40",
    # A page per transaction: the 60 events emitted together are one page, and the
    # settlements' events a few more; the second page is mid-backlog.
    "fan_out.event_committed:2",
    "fan_out.deliveries_written:2",
]


@pytest.mark.rehearse
@pytest.mark.parametrize("spec", HEAVY_CASES)
def test_rehearsal__a_kill_mid_backlog_at_each_point(stack, spec):
    stack.backlog(confirmed=20, crashed=8, events=60)
    doomed = stack.worker("doomed", kill_at=spec)
    killed_at(doomed, spec, timeout=120)
    stack.worker("replacement")
    finished(stack, ["doomed"], timeout=180)


def orphans() -> list[tuple]:
    """Open work that no live job carries and no human was shown (a pending dead letter):
    a charge not settled with no poll or resubmit job, a pending delivery with no deliver
    job. What a dead worker held counts as carried: its rescue hands the job on."""
    return sql(
        "SELECT 'charge', c.id, c.status FROM charges c WHERE c.status NOT IN ('succeeded', 'failed')"
        " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key IN ('charge:poll:' || c.id,"
        " 'charge:resubmit:' || c.id))"
        " AND NOT EXISTS (SELECT 1 FROM dead_letters l WHERE l.state = 'pending_review'"
        " AND l.payload->>'charge_id' = c.id)"
        " UNION ALL SELECT 'delivery', d.id::text, d.state FROM webhook_deliveries d WHERE d.state = 'pending'"
        " AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.dedupe_key = 'webhook_deliver:' || d.id)"
        " AND NOT EXISTS (SELECT 1 FROM dead_letters l WHERE l.state = 'pending_review'"
        " AND l.payload->>'delivery_id' = d.id::text)"
    )


@pytest.mark.rehearse
def test_rehearsal__a_chain_of_kills_one_at_every_point_then_a_finisher(stack):
    stack.backlog(confirmed=20, crashed=8, events=60)
    dead = []
    for i, spec in enumerate(HEAVY_CASES):
        # Each replacement dies at the next point, early in its life, while the backlog
        # lasts; one whose point no longer comes up (that work is done) is killed from
        # outside after a while instead, at whatever instant that is.
        spec = spec.split(":")[0] + ":2"
        worker = stack.worker(f"doomed-{i}", kill_at=spec)
        dead.append(f"doomed-{i}")
        try:
            code = worker.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            continue
        assert code == -signal.SIGKILL, (spec, code, worker.output()[-2000:])
    # The state the finisher inherits: whatever is open is carried by a job (or shown to
    # a human), so a finisher, and nothing else, is what it takes.
    assert orphans() == [], state_of(stack)
    stack.worker("finisher")
    finished(stack, dead, timeout=240)
