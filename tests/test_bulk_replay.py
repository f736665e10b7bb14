"""Bulk replay of dead letters: submit is O(1) in items, the expansion creates each unit
once however often it runs, and each letter's replay happens once, counted on the envelope."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from jobs.bulk_models import BulkItem, BulkOperation, BulkOperationKind, BulkOperationState
from jobs.models import DeadLetter, DeadLetterState, db_ago
from jobs.primitives import expansion
from jobs.runner.worker import Worker
from jobs.services import bulk
from tests.factories.jobs import DeadLetterFactory, JobFactory
from tests.queue_support import claim, claimed_context, count, execute, rows, scalar, task_payload

pytestmark = pytest.mark.django_db

REPLAY = BulkOperationKind.REPLAY_DEAD_LETTERS


def letters(n: int, label: str = "bulk", **fields) -> list[int]:
    """``n`` pending letters of ``record(<label>-<i>)``, in one statement."""
    execute(
        "INSERT INTO dead_letters (job_id, kind, queue, payload, priority, tenant, correlation_id, attempts,"
        " max_attempts, cause, error_category, last_error, job_created_at, created_at, state, replayed_by,"
        " discarded_by, replay_forced)"
        " SELECT gen_random_uuid(), %(kind)s, 'default',"
        "        jsonb_build_object('task', 'tests.tasks.record', 'args', jsonb_build_array(%(label)s || '-' || i),"
        "                           'kwargs', '{}'::jsonb),"
        "        0, '', '', 5, 5, 'exhausted', 'transient', 'boom', now() - interval '10 minutes', now(),"
        "        'pending_review', '', '', false"
        "   FROM generate_series(1, %(n)s) AS i",
        {"n": n, "label": label, "kind": fields.get("kind", "task")},
    )
    return [
        r[0] for r in rows("SELECT id FROM dead_letters WHERE payload->'args'->>0 LIKE %s ORDER BY id", [label + "-%"])
    ]


def submit(**filter) -> int:
    return bulk.bulk_operation_submit(operation=REPLAY, filter=filter, actor="ops-olga")


def envelope(op_id: int) -> BulkOperation:
    return BulkOperation.objects.get(pk=op_id)


def run_all(worker: Worker | None = None) -> None:
    worker = worker or Worker(concurrency=1)
    while worker.run_once():
        pass


def written_rows() -> int:
    """Rows in every table a submit could write to."""
    return sum(count(t) for t in ("bulk_operations", "bulk_items", "jobs", "dead_letters", "processed_jobs"))


@pytest.mark.parametrize("n", [3, 400])
def test_submitting_a_bulk_replay_writes_two_rows_whatever_the_number_of_matches(n):
    letters(n)
    before = written_rows()
    op_id = submit(kinds=["task"])
    assert written_rows() - before == 2
    assert count("jobs", "kind = 'bulk_expand' AND dedupe_key = %s", [f"bulk:{op_id}:expand"]) == 1
    assert envelope(op_id).state == BulkOperationState.EXPANDING


def test_an_unreadable_filter_is_refused_at_submit_and_writes_nothing():
    before = written_rows()
    with pytest.raises(bulk.BulkRefused, match="unknown dead letter filter"):
        submit(colour=["red"])
    with pytest.raises(bulk.BulkRefused, match="since_at needs a timezone"):
        submit(since_at="2026-01-01T00:00:00")
    assert written_rows() == before


def expand_once(*, crash_after_pages: int | None = None):
    """Run the expansion job's handler on its claimed row; with ``crash_after_pages`` its
    heartbeat (between pages) raises, as a worker dying there would stop it."""
    (job,) = claim(batch=1).jobs
    assert job.kind == "bulk_expand"
    ctx = claimed_context(job)
    if crash_after_pages is not None:
        beats = iter(range(crash_after_pages - 1, -1, -1))

        def heartbeat():
            if next(beats) == 0:
                raise SystemExit("worker killed between pages")

        ctx.heartbeat = heartbeat
    return job, expansion.expand(ctx)


def test_an_expansion_that_dies_between_pages_is_seen_expanding_and_its_rerun_creates_each_unit_once(settings):
    settings.VPAY_BULK_PAGE_SIZE = 10
    ids = letters(35)
    op_id = submit()
    with pytest.raises(SystemExit):
        expand_once(crash_after_pages=2)
    half = envelope(op_id)
    assert (half.state, half.matched, half.created, half.cursor) == (BulkOperationState.EXPANDING, 20, 20, ids[19])
    execute("UPDATE jobs SET locked_at = NULL, locked_by = NULL, lease_token = NULL, lease_expires_at = NULL")
    expand_once()  # the rerun resumes from the cursor
    done = envelope(op_id)
    assert (done.state, done.matched, done.created) == (BulkOperationState.RUNNING, 35, 35)
    keys = [r[0] for r in rows("SELECT dedupe_key FROM jobs WHERE kind = 'bulk_item' ORDER BY id")]
    assert sorted(keys) == sorted(f"bulk:{op_id}:{i}" for i in ids)
    assert count("bulk_items", "operation_id = %s", [op_id]) == 35


def test_an_expansion_run_again_from_the_start_after_a_lost_checkpoint_creates_nothing_twice(settings):
    settings.VPAY_BULK_PAGE_SIZE = 10
    letters(25)
    op_id = submit()
    expand_once()
    assert count("jobs", "kind = 'bulk_item'") == 25
    # The expansion's job delivered again with its checkpoint gone (the worst redelivery).
    execute("UPDATE bulk_operations SET state = 'expanding', cursor = 0 WHERE id = %s", [op_id])
    execute("DELETE FROM jobs WHERE kind = 'bulk_expand'")
    JobFactory(
        kind="bulk_expand",
        payload={"operation_id": op_id},
        dedupe_key="again",
        max_attempts=5,
        priority=-10,
        tenant=f"bulk:{op_id}",
    )
    expand_once()
    again = envelope(op_id)
    assert (again.matched, again.created) == (25, 25)
    assert count("jobs", "kind = 'bulk_item'") == 25


def test_running_the_expansion_handler_twice_is_a_no_op_the_second_time(settings):
    settings.VPAY_BULK_PAGE_SIZE = 10
    letters(12)
    op_id = submit()
    job, _ = expand_once()
    assert expansion.expand(claimed_context(job)).action.value == "done"  # the same delivery, again
    assert (envelope(op_id).created, count("jobs", "kind = 'bulk_item'")) == (12, 12)


def test_every_matching_letter_is_replayed_once_and_the_operation_counts_it_done(effects, settings):
    settings.VPAY_BULK_PAGE_SIZE = 7
    ids = letters(20)
    old = DeadLetterFactory(job_created_at=db_ago(days=30), payload=task_payload("tests.tasks.record", "stale"))
    other_kind = letters(2, "sweep", kind="sweep_expired")
    op_id = submit(kinds=["task"])
    run_all()
    final = envelope(op_id)
    assert (final.state, final.matched, final.created, final.done, final.refused) == ("done", 21, 21, 20, 1)
    assert final.finished_at is not None
    assert sorted(label for label, _ in effects("bulk-")) == sorted(f"bulk-{i}" for i in range(1, 21))
    assert dict(DeadLetter.objects.filter(pk__in=ids).values_list("state", "replayed_by").distinct()) == {
        DeadLetterState.REPLAYED: "ops-olga"
    }
    # Past the fence horizon without --force: refused with the single action's reason.
    assert DeadLetter.objects.get(pk=old.pk).state == DeadLetterState.PENDING_REVIEW
    assert BulkItem.objects.get(operation_id=op_id, item_id=old.pk).note.startswith("past_fence_horizon")
    assert set(DeadLetter.objects.filter(pk__in=other_kind).values_list("state", flat=True)) == {"pending_review"}


def test_a_unit_delivered_again_after_its_item_finished_has_no_second_effect(effects, settings):
    letters(3)
    op_id = submit()
    run_all()
    assert len(effects("bulk-")) == 3
    first = BulkItem.objects.filter(operation_id=op_id).order_by("item_id").first()
    # The unit again, under a new job_id (its fence row cannot help): the item's CAS does.
    JobFactory(
        kind="bulk_item",
        payload={"operation_id": op_id, "item_id": first.item_id},
        dedupe_key="redelivered",
        max_attempts=5,
    )
    run_all()
    assert len(effects("bulk-")) == 3
    assert (envelope(op_id).done, envelope(op_id).refused) == (3, 0)
    assert count("jobs", "kind = 'bulk_item'") == 0  # it finished as a no-op, not failing on the counts


def test_a_bulk_replay_matches_only_letters_created_by_its_submit_and_within_since(effects):
    old = letters(2, "old")
    execute("UPDATE dead_letters SET created_at = now() - interval '3 hours' WHERE id = ANY(%s)", [old])
    recent = letters(2, "recent")
    op_id = submit(since_seconds=3600)
    later = letters(1, "later")
    execute("UPDATE dead_letters SET created_at = now() + interval '1 second' WHERE id = ANY(%s)", [later])
    run_all()
    assert envelope(op_id).matched == 2
    states = dict(DeadLetter.objects.values_list("pk", "state"))
    assert [states[i] for i in recent] == ["replayed", "replayed"]
    assert [states[i] for i in old + later] == ["pending_review"] * 3


def test_an_operation_with_nothing_to_do_is_done_when_expanded():
    op_id = submit(kinds=["task"])
    run_all()
    assert (envelope(op_id).state, envelope(op_id).created) == ("done", 0)


# --- the shell ----------------------------------------------------------------------------


def test_replay_bulk_submits_and_returns_at_once_with_the_operation_id():
    letters(5)
    out = io.StringIO()
    call_command("deadletters", "replay", "--bulk", "--kind", "task", stdout=out, stderr=io.StringIO())
    op_id = scalar("SELECT max(id) FROM bulk_operations")
    assert out.getvalue().strip() == f"submitted bulk operation #{op_id} (replay_dead_letters)"
    assert envelope(op_id).filter["kinds"] == ["task"]
    assert count("bulk_items") == 0


def test_replay_bulk_refuses_ids_and_an_unfiltered_selection_without_all_pending():
    for args, message in (
        (("--bulk",), "or --all-pending"),
        (("--bulk", "1", "2"), "give no ids"),
        (("--wait", "--kind", "task"), "go with --bulk"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("deadletters", "replay", *args, stdout=io.StringIO(), stderr=io.StringIO())
    assert count("bulk_operations") == 0


def test_the_console_lists_bulk_operations_with_their_state_and_counts_read_only(client, django_user_model):
    from django.contrib.auth.models import Permission

    letters(3)
    op_id = submit()
    user = django_user_model.objects.create_user(username="vera", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_bulkoperation"))
    client.force_login(user)
    page = client.get("/admin/jobs/bulkoperation/").content.decode()
    assert f">{op_id}<" in page and "expanding" in page
    assert client.get(f"/admin/jobs/bulkoperation/{op_id}/change/").status_code == 200
    assert client.post("/admin/jobs/bulkoperation/add/", {}).status_code == 403
