"""The ops console through Django's test client: permissions, confirmation and reason pages,
compare-and-swap replays and discards, history and admin log entries, queue depth, cancel."""

from __future__ import annotations

import itertools
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from jobs.adapters import postgres as queue
from jobs.maintenance import liveness
from jobs.models import DeadLetter, DeadLetterState, Job, db_ago
from jobs.operator import dead_letter_sql as operator_sql
from jobs.services import dead_letters as ops
from jobs.storage import health_sql
from tests.factories.jobs import DeadLetterFactory
from tests.ops_support import OPERATOR_PERMS, staff_user
from tests.queue_support import claim, count, execute, scalar, task_payload

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:jobs_deadletter_changelist"


def changelist_url() -> str:
    return reverse(CHANGELIST)


def act(client, action: str, ids, **extra):
    """The first POST of an admin action, as the change list's action bar sends it."""
    return client.post(changelist_url(), {"action": action, "index": 0, "_selected_action": list(ids), **extra})


def confirm(client, action: str, ids, **extra):
    """The confirmation page's POST; its messages are read (consumed) into ``response.msgs``."""
    response = client.post(changelist_url(), {"action": action, "_selected_action": list(ids), "post": "yes", **extra})
    response.msgs = [str(m) for m in get_messages(response.wsgi_request)]
    if response.status_code == 302:
        client.get(response.url)  # shows (and so consumes) the messages, as a browser would
    return response


def texts(response) -> list[str]:
    return response.msgs if hasattr(response, "msgs") else [str(m) for m in get_messages(response.wsgi_request)]


# --- permissions ------------------------------------------------------------------------


def test_a_view_only_staff_user_sees_dead_letters_but_no_action_anywhere(client, django_user_model):
    client.force_login(staff_user(django_user_model, "vera", "view_deadletter", "view_job"))
    letter = DeadLetterFactory()

    page = client.get(changelist_url())
    assert page.status_code == 200
    assert letter.correlation_id in page.content.decode()
    assert "action_form" not in page.context or page.context["action_form"] is None
    assert b"replay_selected" not in page.content and b"discard_selected" not in page.content

    detail = client.get(reverse("admin:jobs_deadletter_change", args=[letter.pk]))
    assert detail.status_code == 200
    assert b"replay-this" not in detail.content and b"discard-this" not in detail.content
    jobs_page = client.get(reverse("admin:jobs_job_changelist"))
    assert b"cancel_selected" not in jobs_page.content

    # Posting the action by hand does nothing either.
    confirm(client, "replay_selected", [letter.pk])
    confirm(client, "discard_selected", [letter.pk], reason="because")
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW
    assert count("jobs") == 0
    assert LogEntry.objects.count() == 0


def test_replay_and_discard_are_separate_permissions(client, django_user_model):
    client.force_login(staff_user(django_user_model, "rita", "view_deadletter", "replay_deadletter"))
    letter = DeadLetterFactory()
    page = client.get(changelist_url())
    assert b"replay_selected" in page.content and b"discard_selected" not in page.content
    confirm(client, "discard_selected", [letter.pk], reason="not allowed to")
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW


# --- replay -----------------------------------------------------------------------------


def test_replay_shows_a_confirmation_then_re_enqueues_with_the_same_job_id_and_records_who_and_when(client, operator):
    letter = DeadLetterFactory(dedupe_key="order-7", tenant="m_1", priority=3)

    page = act(client, "replay_selected", [letter.pk])
    assert page.status_code == 200
    assert "admin/jobs/deadletter/replay_confirmation.html" in [t.name for t in page.templates]
    assert str(letter.job_id) in page.content.decode()
    # The confirmation page alone changes nothing.
    assert count("jobs") == 0
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW

    done = confirm(client, "replay_selected", [letter.pk])
    assert done.status_code == 302
    assert any("Replayed 1 dead letter" in m for m in texts(done))
    letter.refresh_from_db()
    assert (letter.state, letter.replayed_by, letter.replay_forced) == (DeadLetterState.REPLAYED, "olga", False)
    assert letter.replayed_at is not None
    job = Job.objects.get()
    assert (job.job_id, job.kind, job.payload, job.attempts) == (letter.job_id, "task", letter.payload, 0)
    assert (job.dedupe_key, job.tenant, job.priority, job.correlation_id) == (
        "order-7",
        "m_1",
        3,
        letter.correlation_id,
    )
    entry = LogEntry.objects.get()
    assert (entry.user_id, entry.object_id) == (operator.pk, str(letter.pk))
    assert f"Replayed as job {job.pk}" in entry.change_message


def test_bulk_replay_is_idempotent_and_refuses_replayed_and_discarded_letters(client, operator):
    letters = [DeadLetterFactory() for _ in range(3)]
    discarded = DeadLetterFactory()
    ops.dead_letter_discard(letter_id=discarded.pk, actor="someone", reason="known duplicate")
    ids = [letter.pk for letter in [*letters, discarded]]

    first = confirm(client, "replay_selected", ids)
    assert any("Replayed 3 dead letters" in m for m in texts(first))
    assert any(f"#{discarded.pk} is discarded" in m for m in texts(first))
    assert count("jobs") == 3

    second = confirm(client, "replay_selected", ids)
    messages_ = texts(second)
    assert not any(m.startswith("Replayed") for m in messages_)
    assert sum("was already replayed" in m for m in messages_) == 3
    assert count("jobs") == 3  # nothing enqueued twice
    assert DeadLetter.objects.filter(state=DeadLetterState.REPLAYED).count() == 3
    assert LogEntry.objects.count() == 3  # refusals write nothing


def test_a_replay_is_refused_while_a_job_holds_the_same_job_id_or_dedupe_key(client, operator):
    letter = DeadLetterFactory()
    queue.enqueue("task", task_payload(), job_id=letter.job_id)
    keyed = DeadLetterFactory(dedupe_key="singleton-like")
    queue.enqueue("task", task_payload(), dedupe_key="singleton-like")

    response = confirm(client, "replay_selected", [letter.pk, keyed.pk])
    assert sum("live job with the same job_id or dedupe key" in m for m in texts(response)) == 2
    assert count("jobs") == 2
    assert DeadLetter.objects.filter(state=DeadLetterState.PENDING_REVIEW).count() == 2


def test_a_letter_past_the_fence_horizon_is_refused_unless_forced_by_someone_allowed_to(
    client, operator, django_user_model, settings
):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    old = DeadLetterFactory(job_created_at=db_ago(days=7))  # its fence row may be gone
    young = DeadLetterFactory(job_created_at=db_ago(days=5))

    page = act(client, "replay_selected", [old.pk, young.pk])
    body = page.content.decode()
    assert "older than the processed_jobs fence TTL allows" in body
    assert 'name="force"' not in body  # the operator may not force

    refused = confirm(client, "replay_selected", [old.pk, young.pk], force="on")
    assert any(f"#{old.pk} is older than the processed_jobs fence TTL" in m for m in texts(refused))
    old.refresh_from_db()
    young.refresh_from_db()
    assert (old.state, young.state) == (DeadLetterState.PENDING_REVIEW, DeadLetterState.REPLAYED)

    boss = staff_user(django_user_model, "boss", *OPERATOR_PERMS, "force_replay_deadletter")
    client.force_login(boss)
    assert 'name="force"' in act(client, "replay_selected", [old.pk]).content.decode()
    confirm(client, "replay_selected", [old.pk])  # not ticked: still refused
    old.refresh_from_db()
    assert old.state == DeadLetterState.PENDING_REVIEW
    confirm(client, "replay_selected", [old.pk], force="on")
    old.refresh_from_db()
    assert (old.state, old.replayed_by, old.replay_forced) == (DeadLetterState.REPLAYED, "boss", True)
    assert "forced past the fence horizon" in LogEntry.objects.get(object_id=str(old.pk)).change_message


def test_the_horizon_counts_from_the_first_enqueue_of_the_job_id_across_earlier_dead_letters(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    job_id = uuid.uuid4()
    first = DeadLetterFactory(job_id=job_id, job_created_at=db_ago(days=8))
    ops.dead_letter_replay(letter_id=first.pk, actor="ops", force=True)
    execute("DELETE FROM jobs")
    # The replayed job failed again: a new letter whose own job_created_at is recent.
    again = DeadLetterFactory(job_id=job_id, job_created_at=db_ago(hours=1))
    assert ops.replay_preview([again.pk])[again.pk] == ops.Refusal.PAST_FENCE_HORIZON


def test_a_letter_past_the_horizon_whose_fence_row_is_still_there_may_be_replayed(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    letter = DeadLetterFactory(job_created_at=db_ago(days=8))
    # The effect ran late in the job's life: its fence row outlives the horizon by a day.
    execute(
        "INSERT INTO processed_jobs (job_id, kind, processed_at, expires_at)"
        " VALUES (%s, 'task', now() - interval '6 days', now() + interval '1 day')",
        [letter.job_id],
    )
    assert ops.replay_preview([letter.pk])[letter.pk] is None
    # Less than the margin left on it: refused again.
    execute("UPDATE processed_jobs SET expires_at = now() + interval '30 minutes' WHERE job_id = %s", [letter.job_id])
    assert ops.replay_preview([letter.pk])[letter.pk] == ops.Refusal.PAST_FENCE_HORIZON


# --- discard ----------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["", "   ", "\n\t "], ids=["empty", "spaces", "whitespace"])
def test_discard_without_a_reason_is_refused_on_the_form(client, operator, reason):
    letter = DeadLetterFactory()
    form = act(client, "discard_selected", [letter.pk])
    assert form.status_code == 200 and b'name="reason"' in form.content

    refused = confirm(client, "discard_selected", [letter.pk], reason=reason)
    assert refused.status_code == 400
    assert b"A reason is required" in refused.content
    letter.refresh_from_db()
    assert letter.state == DeadLetterState.PENDING_REVIEW
    assert LogEntry.objects.count() == 0


def test_discard_records_who_when_and_the_trimmed_reason_and_a_log_entry(client, operator):
    letters = [DeadLetterFactory(), DeadLetterFactory()]
    response = confirm(client, "discard_selected", [x.pk for x in letters], reason="  merchant closed the order \n")
    assert response.status_code == 302
    for letter in letters:
        letter.refresh_from_db()
        assert (letter.state, letter.discarded_by, letter.discard_reason) == (
            DeadLetterState.DISCARDED,
            "olga",
            "merchant closed the order",
        )
        assert letter.discarded_at is not None
    assert (
        sorted(LogEntry.objects.values_list("change_message", flat=True))
        == ["Discarded: merchant closed the order"] * 2
    )
    # Discarded is final: neither a replay nor a second discard touches it.
    again = confirm(client, "replay_selected", [letters[0].pk])
    assert any("is discarded" in m for m in texts(again))
    confirm(client, "discard_selected", [letters[0].pk], reason="other reason")
    letters[0].refresh_from_db()
    assert letters[0].discard_reason == "merchant closed the order"


def test_the_service_refuses_a_blank_reason_and_the_database_is_the_final_guard():
    letter = DeadLetterFactory()
    assert ops.dead_letter_discard(letter_id=letter.pk, actor="ops", reason="  ").refusal == ops.Refusal.REASON_REQUIRED
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        operator_sql.discard_dead_letter(letter.pk, actor="ops", reason=" ")


# --- the pages ----------------------------------------------------------------------------


def test_the_admin_index_shows_how_many_dead_letters_are_pending_review(client, operator):
    DeadLetterFactory()
    DeadLetterFactory()
    done = DeadLetterFactory()
    ops.dead_letter_discard(letter_id=done.pk, actor="ops", reason="noise")
    page = client.get(reverse("admin:index"))
    assert b'<strong id="pending-review-count">2</strong> dead letters pending review' in page.content


def test_the_change_list_shows_age_error_excerpt_and_filters_and_searches(client, operator):
    old = DeadLetterFactory(last_error="PermanentError: card declined\n" + "x" * 500)
    execute("UPDATE dead_letters SET created_at = now() - interval '3 hours 5 minutes' WHERE id = %s", [old.pk])
    new = DeadLetterFactory(kind="sweep_expired", queue="maintenance")

    page = client.get(changelist_url()).content.decode()
    assert "3h 5m" in page and "PermanentError: card declined" in page
    assert "x" * 100 not in page  # an excerpt, not the whole error

    def listed(query: str) -> set[int]:
        return {letter.pk for letter in client.get(changelist_url() + query).context["cl"].result_list}

    assert listed("?created=1h") == {new.pk}
    assert listed("?created=24h") == {new.pk, old.pk}
    assert listed("?kind=sweep_expired") == {new.pk}
    assert listed("?queue=maintenance") == {new.pk}
    assert listed(f"?q={old.job_id}") == {old.pk}
    year, month, day = scalar(
        "SELECT ARRAY[extract(year FROM created_at), extract(month FROM created_at), extract(day FROM created_at)]::int[]"
        " FROM dead_letters WHERE id = %s",
        [new.pk],
    )
    assert new.pk in listed(f"?created_at__year={year}&created_at__month={month}&created_at__day={day}")
    assert listed(f"?created_at__year={year - 1}") == set()
    assert listed(f"?q={new.correlation_id}") == {new.pk}
    assert listed("?q=not-a-uuid") == set()


def test_the_past_horizon_filter_lists_the_letters_a_replay_would_refuse_for_their_age(client, operator, settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    old = DeadLetterFactory(job_created_at=db_ago(days=8))
    # Inside the margin: the TTL has not run out, but less than the margin of it is left.
    within_margin = DeadLetterFactory(job_created_at=db_ago(days=6, hours=23, minutes=30))
    fresh = DeadLetterFactory(job_created_at=db_ago(days=6))
    listed = {letter.pk for letter in client.get(changelist_url() + "?created=past_horizon").context["cl"].result_list}
    assert listed == {old.pk, within_margin.pk}
    preview = ops.replay_preview([old.pk, within_margin.pk, fresh.pk])
    assert preview == {
        old.pk: ops.Refusal.PAST_FENCE_HORIZON,
        within_margin.pk: ops.Refusal.PAST_FENCE_HORIZON,
        fresh.pk: None,
    }


def test_the_detail_page_is_read_only_with_pretty_payload_full_error_and_history(client, operator):
    letter = DeadLetterFactory(payload={"task": "tests.tasks.record", "args": ["a"], "kwargs": {"k": 1}})
    ops.dead_letter_replay(letter_id=letter.pk, actor="olga")
    page = client.get(reverse("admin:jobs_deadletter_change", args=[letter.pk])).content.decode()
    assert "&quot;kwargs&quot;: {\n    &quot;k&quot;: 1\n  }" in page  # indented JSON, escaped
    assert "second line of the traceback" in page  # the full error
    assert "Replayed " in page and "by olga" in page
    assert 'name="_save"' not in page  # nobody edits a dead letter
    again = DeadLetterFactory(job_id=letter.job_id)
    page = client.get(reverse("admin:jobs_deadletter_change", args=[letter.pk])).content.decode()
    link = reverse("admin:jobs_deadletter_change", args=[again.pk])
    assert f'<a href="{link}">#{again.pk}</a> (pending_review)' in page  # the same job_id failed again
    assert "replay-this" not in page  # already replayed: no button


def test_the_detail_page_offers_replay_and_discard_that_run_the_same_actions(client, operator):
    letter = DeadLetterFactory()
    page = client.get(reverse("admin:jobs_deadletter_change", args=[letter.pk])).content.decode()
    assert 'id="replay-this"' in page and 'id="discard-this"' in page
    # The button posts the action without an index: the confirmation step.
    confirmation = client.post(changelist_url(), {"action": "replay_selected", "_selected_action": [letter.pk]})
    assert confirmation.status_code == 200 and b"confirm-replay" in confirmation.content


# --- jobs: depth and cancel -----------------------------------------------------------------


def test_the_jobs_page_summarises_depth_by_queue_and_kind_with_the_oldest_claimable_age(client, operator):
    for _ in range(3):
        queue.enqueue("task", task_payload())
    queue.enqueue("task", task_payload(), delay=3600)
    queue.enqueue("task", task_payload(), queue="slow")
    execute("UPDATE jobs SET run_at = now() - interval '2 hours 3 minutes' WHERE queue = 'default' AND run_at <= now()")
    claim(queues=("slow",))

    summary = {(r.queue, r.kind): r for r in health_sql.queue_summary()}
    assert (summary["default", "task"].claimable, summary["default", "task"].scheduled) == (3, 1)
    assert summary["slow", "task"].leased == 1
    assert 7380 <= summary["default", "task"].oldest_claimable_seconds < 7400

    page = client.get(reverse("admin:jobs_job_changelist")).content.decode()
    assert 'id="queue-summary"' in page and "2h 3m" in page
    assert "leased" in page and "scheduled" in page and "claimable" in page


def test_cancel_ends_a_waiting_job_asks_a_running_one_to_stop_and_refuses_a_charge_poll_saying_why(client, operator):
    waiting = queue.enqueue("task", task_payload("tests.tasks.record", "cancel-me"), correlation_id="c-1")
    running = queue.enqueue("task", task_payload(), queue="busy")
    poll = queue.enqueue("poll_charge", {"charge_id": "ch_1"}, queue="polls")
    liveness.worker_heartbeat(liveness.WorkerIdentity("worker-a", "host", 1, 1, "busy"), 30)  # a live worker
    claim(queues=("busy",))
    ids = list(Job.objects.order_by("id").values_list("pk", flat=True))
    url = reverse("admin:jobs_job_changelist")

    form = client.post(url, {"action": "cancel_selected", "index": 0, "_selected_action": ids})
    assert form.status_code == 200 and b"running" in form.content and b"poll_charge" in form.content
    blank = client.post(url, {"action": "cancel_selected", "_selected_action": ids, "post": "yes", "reason": " "})
    assert blank.status_code == 400 and count("jobs") == 3

    done = client.post(
        url, {"action": "cancel_selected", "_selected_action": ids, "post": "yes", "reason": "wrong amount"}
    )
    assert any("cancelled: dead letter #" in m for m in texts(done))
    assert any("cancel requested" in m for m in texts(done))
    assert any("cannot be cancelled" in m and "Resolve the charge instead" in m for m in texts(done))
    assert set(Job.objects.values_list("job_id", flat=True)) == {running, poll}
    assert Job.objects.get(job_id=running).cancel_requested_by == "olga"
    assert Job.objects.get(job_id=poll).cancel_requested_at is None
    letter = DeadLetter.objects.get(job_id=waiting)
    assert (letter.cause, letter.state, letter.discarded_by, letter.discard_reason, letter.correlation_id) == (
        "cancelled",
        DeadLetterState.DISCARDED,
        "olga",
        "wrong amount",
        "c-1",
    )
    assert letter.payload["args"] == ["cancel-me"]
    assert LogEntry.objects.filter(object_id=str(letter.pk)).exists()
    listing = client.get(url).content.decode()
    assert "cancelling" in listing


# --- the replay decision, cell by cell -------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "kind", "live", "past_horizon", "force"),
    list(itertools.product(list(DeadLetterState), ["task", "gone_kind"], [False, True], [False, True], [False, True])),
)
def test_replay_refusal_table(state, kind, live, past_horizon, force):
    status = operator_sql.LetterStatus(1, state, kind, uuid.uuid4(), "exhausted", past_horizon, live, False)
    if state == DeadLetterState.REPLAYED:
        expected = ops.Refusal.ALREADY_REPLAYED
    elif state == DeadLetterState.DISCARDED:
        expected = ops.Refusal.DISCARDED
    elif kind == "gone_kind":
        expected = ops.Refusal.UNKNOWN_KIND
    elif live:
        expected = ops.Refusal.JOB_LIVE
    elif past_horizon and not force:
        expected = ops.Refusal.PAST_FENCE_HORIZON
    else:
        expected = None
    assert ops.replay_refusal(status, force=force) == expected


def test_replay_refusal_of_a_missing_letter():
    assert ops.replay_refusal(None, force=True) == ops.Refusal.NOT_FOUND
    assert ops.dead_letter_replay(letter_id=987654, actor="ops").refusal == ops.Refusal.NOT_FOUND
