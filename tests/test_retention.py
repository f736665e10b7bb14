"""The retention steps of sweep_expired, at the edges of each window and against each
"still live" guard, and the guards repeated in the DELETE itself."""

from __future__ import annotations

import pytest

from charges import retention as charge_retention
from jobs.adapters import postgres as queue
from jobs.kinds import JobKind
from jobs.maintenance import retention as job_retention
from merchants.services import create_merchant
from tests.retention_support import (
    DAY,
    MINUTE,
    alert,
    delivery,
    endpoint,
    event,
    ids,
    provider_request,
    run_sweep,
    settled_letter,
    sql,
)
from webhooks import retention as webhook_retention

pytestmark = pytest.mark.django_db(transaction=True)

INSIDE, OUTSIDE = -MINUTE, MINUTE  # relative to a window's edge


@pytest.fixture
def merchant():
    return create_merchant("Retention")[0]


def test_an_event_just_past_30_days_goes_with_its_finished_deliveries_and_their_attempts(merchant):
    ep = endpoint(merchant)
    old = event(merchant, seconds_old=30 * DAY + OUTSIDE)
    young = event(merchant, seconds_old=30 * DAY + INSIDE)
    old_deliveries = [delivery(old, ep, state="succeeded", finished_seconds_ago=MINUTE)]
    delivery(young, ep, state="exhausted", finished_seconds_ago=MINUTE)
    run_sweep()
    assert ids("events") == {young}
    assert not ids("webhook_deliveries") & set(old_deliveries)
    assert sql("SELECT count(*) FROM webhook_delivery_attempts")[0][0] == 1  # the young event's


@pytest.mark.parametrize("state", ["pending", "delivering"])
def test_an_old_event_with_an_unfinished_delivery_keeps_the_event_the_delivery_and_its_attempts(merchant, state):
    ep, other = endpoint(merchant, "a"), endpoint(merchant, "b")
    old = event(merchant, seconds_old=90 * DAY)
    if state == "delivering":
        live = delivery(old, ep, state="pending")
        sql(
            "UPDATE webhook_deliveries SET state = 'delivering', lease_token = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 minute' WHERE id = %s",
            [live],
        )
    else:
        live = delivery(old, ep, state="pending")
    delivery(old, other, state="succeeded", finished_seconds_ago=90 * DAY)
    run_sweep()
    assert ids("events") == {old}
    assert live in ids("webhook_deliveries")
    assert sql("SELECT count(*) FROM webhook_delivery_attempts WHERE delivery_id = %s", [live])[0][0] == 1


@pytest.mark.parametrize("fan_out", ["pending", "abandoned"])
def test_an_old_event_not_fanned_out_stays(merchant, fan_out):
    kept = event(merchant, seconds_old=90 * DAY, fan_out=fan_out)
    run_sweep()
    assert ids("events") == {kept}


def test_a_delivery_just_past_30_days_after_it_finished_goes_with_its_attempts(merchant):
    ep = endpoint(merchant)
    fresh = event(merchant)
    delivery(fresh, ep, state="refused", finished_seconds_ago=30 * DAY + OUTSIDE)
    other = endpoint(merchant, "b")
    young = delivery(fresh, other, state="cancelled", finished_seconds_ago=30 * DAY + INSIDE)
    run_sweep()
    assert ids("webhook_deliveries") == {young}
    assert sql("SELECT delivery_id FROM webhook_delivery_attempts") == [(young,)]
    assert ids("events") == {fresh}  # a young event stays, whatever became of its deliveries


def test_an_unfinished_delivery_is_never_retention_s_even_with_an_old_completed_at(merchant):
    ep = endpoint(merchant)
    # A resend moved it back to pending (reopen clears completed_at; an old one left behind
    # must still not make it deletable).
    live = delivery(event(merchant), ep, state="pending", finished_seconds_ago=90 * DAY)
    run_sweep()
    assert live in ids("webhook_deliveries")


def test_rail_requests_of_settled_charges_go_after_90_days_and_a_live_charges_never(merchant):
    old = provider_request(merchant, charge_status="succeeded", seconds_old=90 * DAY + OUTSIDE)
    old_failed = provider_request(merchant, charge_status="failed", seconds_old=90 * DAY + OUTSIDE)
    young = provider_request(merchant, charge_status="succeeded", seconds_old=90 * DAY + INSIDE)
    live = {
        status: provider_request(merchant, charge_status=status, seconds_old=400 * DAY)
        for status in ("submitting", "submitted", "unresolved")
    }
    run_sweep()
    assert old not in ids("provider_requests") and old_failed not in ids("provider_requests")
    assert ids("provider_requests") == {young, *live.values()}


def test_a_live_refunds_rail_requests_stay_however_old_and_a_settled_ones_go(merchant):
    """A refund's requests hang off its (succeeded) charge; the refund's own state decides:
    they are the evidence its recovery reads to ask the rail rather than send again."""
    live = {
        status: provider_request(merchant, charge_status="succeeded", refund_status=status, seconds_old=400 * DAY)
        for status in ("submitting", "pending", "unresolved")
    }
    settled = {
        status: provider_request(merchant, charge_status="succeeded", refund_status=status, seconds_old=400 * DAY)
        for status in ("succeeded", "failed")
    }
    run_sweep()
    assert ids("provider_requests") == set(live.values())
    assert not set(settled.values()) & ids("provider_requests")


def test_settled_dead_letters_go_90_days_after_settling_and_pending_ones_never():
    replayed = settled_letter("replayed", seconds_ago=90 * DAY + OUTSIDE)
    discarded = settled_letter("discarded", seconds_ago=90 * DAY + OUTSIDE)
    young = settled_letter("discarded", seconds_ago=90 * DAY + INSIDE)
    pending = settled_letter("pending_review", seconds_ago=400 * DAY)
    # Only the state says "settled": a pending letter carrying an old replay time (a replay
    # whose job was put back by hand) is still pending.
    stamped = settled_letter("pending_review", seconds_ago=DAY)
    sql("UPDATE dead_letters SET replayed_at = now() - interval '400 days' WHERE id = %s", [stamped])
    run_sweep()
    assert replayed not in ids("dead_letters") and discarded not in ids("dead_letters")
    assert ids("dead_letters") == {young, pending, stamped}


def test_alerts_go_after_90_days_unless_unlogged_or_still_referred_to_by_a_job_or_a_pending_letter():
    old = alert(seconds_old=90 * DAY + OUTSIDE)
    young = alert(seconds_old=90 * DAY + INSIDE)
    unlogged = alert(seconds_old=400 * DAY, logged=False)
    queued = alert(seconds_old=400 * DAY)
    queue.enqueue(JobKind.SEND_ALERT, {"alert_id": queued}, delay=3600)
    buried = alert(seconds_old=400 * DAY)
    settled_letter("pending_review", seconds_ago=DAY, kind="send_alert", payload={"alert_id": buried})
    run_sweep()
    assert old not in ids("alerts")
    assert ids("alerts") == {young, unlogged, queued, buried}


class _Ctx:
    """A step context for driving a page function directly: no cursor, no checkpoint."""

    cursor = None

    def checkpoint(self, cursor) -> None:
        pass

    def remaining(self) -> float:
        return 60.0


def test_a_backlog_behind_live_rows_is_reached_across_pages(merchant, monkeypatch):
    # Live rows older than everything else must not starve the rows behind them.
    monkeypatch.setattr(charge_retention, "PAGE", 2)
    live = [provider_request(merchant, charge_status="unresolved", seconds_old=500 * DAY) for _ in range(3)]
    old = [provider_request(merchant, charge_status="succeeded", seconds_old=(400 - i) * DAY) for i in range(5)]
    result = charge_retention.old_provider_requests(_Ctx())
    assert result.count == 5 and not result.more
    assert ids("provider_requests") == set(live)
    assert not set(old) & ids("provider_requests")


# --- the guards live in the DELETE: a row that changed after the page was read is kept ------


def test_the_events_delete_rechecks_age_and_liveness_on_the_row_as_it_is_now(merchant):
    ep = endpoint(merchant)
    aged, reopened = event(merchant, seconds_old=60 * DAY), event(merchant, seconds_old=60 * DAY)
    delivery(aged, ep, state="succeeded", finished_seconds_ago=DAY)
    gone = delivery(reopened, ep, state="succeeded", finished_seconds_ago=DAY)
    page = [key[-1] for key in webhook_retention._events_page(None, 10)]
    assert set(page) == {aged, reopened}
    sql("UPDATE events SET created_at = now() WHERE id = %s", [aged])  # younger than it was read
    sql("UPDATE webhook_deliveries SET state = 'pending', completed_at = NULL WHERE id = %s", [gone])  # a resend
    assert webhook_retention._delete_events(page) == 0
    assert ids("events") == {aged, reopened}


def test_the_deliveries_delete_rechecks_state_and_age(merchant):
    ep, other = endpoint(merchant, "a"), endpoint(merchant, "b")
    fresh = event(merchant)
    reopened = delivery(fresh, ep, state="exhausted", finished_seconds_ago=60 * DAY)
    aged = delivery(fresh, other, state="succeeded", finished_seconds_ago=60 * DAY)
    page = [key[-1] for key in webhook_retention._deliveries_page(None, 10)]
    assert set(page) == {reopened, aged}
    sql("UPDATE webhook_deliveries SET state = 'pending' WHERE id = %s", [reopened])
    sql("UPDATE webhook_deliveries SET completed_at = now() WHERE id = %s", [aged])
    assert webhook_retention._delete_deliveries(page) == 0


def test_the_provider_requests_delete_rechecks_the_charge_and_the_age(merchant):
    live = provider_request(merchant, charge_status="succeeded", seconds_old=400 * DAY)
    aged = provider_request(merchant, charge_status="succeeded", seconds_old=400 * DAY)
    page = [key[-1] for key in charge_retention._read_page(None, 10)]
    assert set(page) == {live, aged}
    sql(
        "UPDATE charges SET status = 'unresolved' WHERE id = (SELECT charge_id FROM provider_requests WHERE id = %s)",
        [live],
    )
    sql("UPDATE provider_requests SET sent_at = now() WHERE id = %s", [aged])
    assert charge_retention._delete_page(page) == 0


def test_the_dead_letters_and_alerts_deletes_recheck_their_guards():
    letter = settled_letter("discarded", seconds_ago=400 * DAY)
    assert [key[-1] for key in job_retention._letters_page(None, 10)] == [letter]
    sql("UPDATE dead_letters SET discarded_at = now() WHERE id = %s", [letter])
    assert job_retention._delete_letters([letter]) == 0
    old = alert(seconds_old=400 * DAY)
    assert [key[-1] for key in job_retention._alerts_page(None, 10)] == [old]
    queue.enqueue(JobKind.SEND_ALERT, {"alert_id": old}, delay=3600)  # replayed meanwhile
    assert job_retention._delete_alerts([old]) == 0
