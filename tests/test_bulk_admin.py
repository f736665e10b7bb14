"""Bulk operations submitted from the admin (Django's test client, the real database): the
confirmation step counts what matches on the database clock and writes nothing; the submit
writes one operation and one expansion job with the reason; a missing reason or a bad
window is refused with a clear message and writes nothing; the operator lands on the
operation's page, which follows its progress while a real worker loop runs it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.urls import reverse

from jobs.bulk_models import BulkOperation
from jobs.runner.worker import Worker
from tests.ops_support import OPERATOR_PERMS, staff_user
from tests.queue_support import count, execute
from tests.test_bulk_replay import letters, written_rows
from tests.test_bulk_resend import failed_deliveries
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db

REPLAY = "admin:jobs_deadletter_bulk_replay"
RESEND = "admin:webhooks_webhookdelivery_bulk_resend"


@pytest.fixture
def operator(client, django_user_model):
    user = staff_user(django_user_model, "olga", *OPERATOR_PERMS, "view_bulkoperation")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookdelivery", "resend_webhookdelivery"])
    )
    client.force_login(user)
    return user


def operations() -> int:
    return count("bulk_operations") + count("jobs", "kind = 'bulk_expand'")


def run_bulk(settings) -> None:
    worker = Worker(concurrency=1, queues=[settings.VPAY_BULK_QUEUE])
    while worker.run_once():
        pass


# --- bulk replay --------------------------------------------------------------------------


def test_the_dead_letters_list_links_to_the_bulk_replay_with_its_filters(client, operator):
    page = client.get(reverse("admin:jobs_deadletter_changelist") + "?kind__exact=task&created=24h&state__exact=x")
    url = reverse(REPLAY) + "?kind=task&amp;since=24h"
    assert f'href="{url}" id="bulk-replay-link"' in page.content.decode()


def test_bulk_replay_confirmation_counts_the_matches_and_writes_nothing(client, operator):
    letters(3)
    letters(2, label="other", kind="sweep_expired")
    execute("UPDATE dead_letters SET created_at = now() - interval '3 hours' WHERE kind = 'sweep_expired'")
    before = written_rows()
    page = client.get(reverse(REPLAY) + "?kind=task")
    assert page.status_code == 200
    assert '<p id="bulk-match-count"><strong>3</strong> pending dead letters currently match' in page.content.decode()
    assert 'name="reason"' in page.content.decode()
    assert client.get(reverse(REPLAY) + "?all_pending=on").context["preview"].matched == 5
    assert client.get(reverse(REPLAY) + "?since=1h").context["preview"].matched == 3  # on the database clock
    assert written_rows() == before


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"since": "yesterday"}, "give a duration like 30m, 12h, 7d or an ISO-8601 time"),
        ({"since": "2026-01-01T00:00:00"}, "an ISO-8601 time needs a timezone"),
        ({}, "Give a filter (kind, queue, cause, since), or tick"),
    ],
    ids=["unreadable", "naive", "no-filter"],
)
def test_bulk_replay_refuses_a_bad_filter_saying_why_and_writes_nothing(client, operator, query, message):
    letters(2)
    before = written_rows()
    page = client.post(reverse(REPLAY), {**query, "reason": "outage over"})
    assert page.status_code == 400
    assert message in page.content.decode()
    assert page.context["preview"] is None  # no count for a filter that cannot be read
    assert written_rows() == before


def test_bulk_replay_without_a_reason_is_refused_and_writes_nothing(client, operator):
    letters(2)
    before = written_rows()
    page = client.post(reverse(REPLAY), {"kind": "task", "reason": "  "})
    assert page.status_code == 400
    assert "A reason is required for a bulk replay" in page.content.decode()
    assert written_rows() == before


def test_bulk_replay_submits_one_operation_and_one_expansion_job_then_shows_its_progress(client, operator, settings):
    settings.VPAY_BULK_QUEUE = "bulk"
    settings.VPAY_BULK_PAGE_SIZE = 2
    ids = letters(5)
    response = client.post(reverse(REPLAY), {"kind": "task", "since": "1h", "reason": " rail outage over "})
    op = BulkOperation.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:jobs_bulkoperation_change", args=[op.pk])
    assert (op.operation, op.state, op.requested_by, op.user_id, op.reason) == (
        "replay_dead_letters",
        "expanding",
        "olga",
        operator.pk,
        "rail outage over",
    )
    assert op.filter == {"kinds": ["task"], "queues": None, "causes": None, "since_seconds": 3600.0, "since_at": None}
    assert op.options == {"force": False}
    assert operations() == 2  # the envelope and its expansion job, nothing per letter
    assert count("jobs") == 1
    assert any(f"Submitted bulk operation #{op.pk}" in str(m) for m in get_messages(response.wsgi_request))

    page = client.get(response["Location"]).content.decode()
    assert '<strong id="bulk-state">expanding</strong>' in page
    assert '<meta http-equiv="refresh" content="2">' in page  # follows itself while not done
    run_bulk(settings)
    page = client.get(response["Location"]).content.decode()
    assert '<strong id="bulk-state">done</strong>' in page
    assert '<td id="bulk-matched">5</td>' in page and '<td id="bulk-done">5</td>' in page
    assert 'http-equiv="refresh"' not in page  # done: it stops reloading
    assert count("dead_letters", "id = ANY(%s) AND state = 'replayed'", [ids]) == 5


def test_bulk_replay_is_refused_without_the_replay_permission_and_force_needs_its_own(client, django_user_model):
    letters(1)
    client.force_login(staff_user(django_user_model, "vera", "view_deadletter"))
    assert client.get(reverse(REPLAY) + "?kind=task").status_code == 403
    assert client.post(reverse(REPLAY), {"kind": "task", "reason": "x"}).status_code == 403
    client.force_login(staff_user(django_user_model, "rita", "view_deadletter", "replay_deadletter"))
    assert "force" not in client.get(reverse(REPLAY) + "?kind=task").context["filters"].fields
    client.post(reverse(REPLAY), {"kind": "task", "force": "on", "reason": "x"})
    assert BulkOperation.objects.get().options == {"force": False}  # not hers to give
    assert count("bulk_operations") == 1


# --- bulk resend --------------------------------------------------------------------------


def test_bulk_resend_confirmation_counts_the_window_on_the_database_clock_and_writes_nothing(client, operator):
    failed_deliveries([2, 3, 30, 0.1])
    before = operations()
    page = client.get(reverse(RESEND) + "?since=12h&until=1h")
    assert page.status_code == 200
    assert "<strong>2</strong> failed deliveries currently match" in page.content.decode()
    assert client.get(reverse(RESEND) + "?since=2d").context["preview"].matched == 4
    assert operations() == before
    listing = client.get(reverse("admin:webhooks_webhookdelivery_changelist")).content.decode()
    assert f'href="{reverse(RESEND)}" id="bulk-resend-link"' in listing


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"until": "1h"}, "Give the window&#x27;s start (since)"),
        ({"since": "1h", "until": "12h"}, "the window is empty: since must be further back than until"),
        (
            {"since": "2026-01-02T00:00:00+00:00", "until": "2026-01-01T00:00:00+00:00"},
            "the window is empty: since must be before until",
        ),
        ({"since": "2999-01-01T00:00:00+00:00"}, "the window is empty: its start is not before its end"),
        ({"since": "soon"}, "give a duration like 30m, 12h, 7d or an ISO-8601 time"),
    ],
    ids=["no-start", "inverted-durations", "inverted-instants", "future-start", "unreadable"],
)
def test_bulk_resend_refuses_a_bad_window_saying_why_and_writes_nothing(client, operator, query, message):
    failed_deliveries([2])
    before = operations()
    page = client.post(reverse(RESEND), {**query, "reason": "outage over"})
    assert page.status_code == 400
    assert message in page.content.decode()
    assert operations() == before


def test_bulk_resend_without_a_reason_is_refused_and_writes_nothing(client, operator):
    failed_deliveries([2])
    page = client.post(reverse(RESEND), {"since": "12h", "reason": ""})
    assert page.status_code == 400
    assert "A reason is required for a bulk resend" in page.content.decode()
    assert operations() == 0


def test_bulk_resend_submits_one_operation_and_resends_the_window_with_the_reason(client, operator, settings):
    settings.VPAY_BULK_QUEUE = "bulk"
    inside, too_old = failed_deliveries([2, 30])
    response = client.post(
        reverse(RESEND), {"since": "12h", "until": "1h", "state": ["exhausted"], "reason": "receiver back up"}
    )
    op = BulkOperation.objects.get()
    assert response["Location"] == reverse("admin:jobs_bulkoperation_change", args=[op.pk])
    assert (op.operation, op.reason, op.filter["since_seconds"], op.filter["until_seconds"], op.filter["states"]) == (
        "resend_deliveries",
        "receiver back up",
        43200.0,
        3600.0,
        ["exhausted"],
    )
    assert operations() == 2
    run_bulk(settings)
    op.refresh_from_db()
    assert (op.state, op.matched, op.done, op.refused) == ("done", 1, 1, 0)
    assert WebhookDelivery.objects.get(pk=inside).state == "pending"
    assert WebhookDelivery.objects.get(pk=too_old).state == "exhausted"
    from django.contrib.admin.models import LogEntry

    [entry] = LogEntry.objects.filter(object_id=str(inside))
    assert (entry.user_id, entry.change_message) == (
        operator.pk,
        f"Resent (fresh retry ladder): bulk operation #{op.pk}: receiver back up",
    )
