"""``manage.py deadletters list|replay|discard``: selection, guards, dry run, progress, errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from jobs.management.commands.deadletters import parse_since
from jobs.models import DeadLetter, DeadLetterState, db_ago
from jobs.services import dead_letters as ops
from tests.conftest import ROOT, database_url
from tests.factories.jobs import DeadLetterFactory
from tests.queue_support import count, execute, scalar

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("deadletters", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_refused(*args: str) -> tuple[str, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("deadletters", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue(), str(raised.value)


def states() -> dict[int, str]:
    return dict(DeadLetter.objects.values_list("pk", "state"))


# --- list ---------------------------------------------------------------------------------


def test_list_shows_pending_letters_newest_first_with_age_and_error_excerpt():
    old = DeadLetterFactory(last_error="PermanentError: card declined\nTraceback...")
    execute("UPDATE dead_letters SET created_at = now() - interval '2 days 3 hours' WHERE id = %s", [old.pk])
    new = DeadLetterFactory(kind="sweep_expired", queue="maintenance")
    done = DeadLetterFactory()
    ops.dead_letter_discard(letter_id=done.pk, actor="ops", reason="noise")

    out, _ = run("list")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["id", "state", "kind"]
    assert [line.split()[0] for line in lines[1:3]] == [str(new.pk), str(old.pk)]
    assert "2d 3h" in out and "PermanentError: card declined" in out and "Traceback" not in out
    assert lines[-1] == "2 dead letters"
    assert str(done.pk) in run("list", "--state", "all")[0]
    assert run("list", "--state", "discarded")[0].splitlines()[-1] == "1 dead letter"


def test_list_filters_by_kind_queue_since_and_ids():
    old = DeadLetterFactory()
    execute("UPDATE dead_letters SET created_at = now() - interval '3 hours' WHERE id = %s", [old.pk])
    new = DeadLetterFactory(kind="sweep_expired", queue="maintenance")

    def ids(*args: str) -> set[int]:
        return {int(line.split()[0]) for line in run("list", *args)[0].splitlines()[1:-1]}

    assert ids("--kind", "sweep_expired") == {new.pk}
    assert ids("--kind", "sweep_expired", "--kind", "task") == {new.pk, old.pk}
    assert ids("--queue", "maintenance") == {new.pk}
    assert ids("--since", "1h") == {new.pk}
    assert ids("--since", "4h") == {new.pk, old.pk}
    created = scalar("SELECT created_at FROM dead_letters WHERE id = %s", [new.pk])
    assert ids("--since", created.isoformat()) == {new.pk}
    assert ids(str(old.pk)) == {old.pk}
    assert ids("--limit", "1") == {new.pk}


@pytest.mark.parametrize("text", ["yesterday", "5x", "2026-11-30T10:00:00"])
def test_a_bad_since_is_a_clear_error(text):
    with pytest.raises(CommandError, match="--since"):
        parse_since(text)


def test_parse_since_reads_durations_and_instants():
    assert parse_since("90s") == (90.0, None)
    assert parse_since("30m") == (1800.0, None)
    assert parse_since("1.5h") == (5400.0, None)
    assert parse_since("7d") == (604800.0, None)
    seconds, instant = parse_since("2026-11-30T10:00:00+00:00")
    assert seconds is None and instant.isoformat() == "2026-11-30T10:00:00+00:00"


# --- replay -------------------------------------------------------------------------------


def test_replay_by_ids_re_enqueues_then_refuses_a_second_time():
    letters = [DeadLetterFactory(), DeadLetterFactory()]
    ids = [str(x.pk) for x in letters]
    out, _ = run("replay", *ids, "--actor", "olga")
    assert out.strip() == "replayed 2, refused 0"
    assert count("jobs") == 2
    letter = DeadLetter.objects.get(pk=letters[0].pk)
    assert (letter.state, letter.replayed_by) == (DeadLetterState.REPLAYED, "olga")
    assert scalar("SELECT job_id FROM jobs ORDER BY id LIMIT 1") == letters[0].job_id

    out, err, error = run_refused("replay", *ids)
    assert out.strip() == "replayed 0, refused 2"
    assert f"#{letters[0].pk}: was already replayed" in err
    assert "2 of 2 refused" in error
    assert count("jobs") == 2


def test_replay_by_filter_takes_only_pending_letters_of_that_kind_and_names_the_shell_user():
    task = DeadLetterFactory()
    sweep = DeadLetterFactory(kind="sweep_expired", payload={})
    discarded = DeadLetterFactory()
    ops.dead_letter_discard(letter_id=discarded.pk, actor="ops", reason="noise")

    out, _ = run("replay", "--kind", "task")
    assert out.strip() == "replayed 1, refused 0"
    now = states()
    assert (now[task.pk], now[sweep.pk], now[discarded.pk]) == ("replayed", "pending_review", "discarded")
    assert DeadLetter.objects.get(pk=task.pk).replayed_by.startswith("shell:")


def test_replay_or_discard_with_no_ids_and_no_filter_needs_all_pending():
    DeadLetterFactory()
    DeadLetterFactory()
    _, _, error = run_refused("replay")
    assert "--all-pending" in error
    _, _, error = run_refused("discard", "--reason", "cleanup")
    assert "--all-pending" in error
    assert count("jobs") == 0
    assert run("replay", "--all-pending")[0].strip() == "replayed 2, refused 0"


def test_replay_past_the_fence_horizon_needs_force(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    old = DeadLetterFactory(job_created_at=db_ago(days=8))
    _, err, _ = run_refused("replay", str(old.pk))
    assert "fence TTL" in err and "--force" in err
    assert count("jobs") == 0
    run("replay", str(old.pk), "--force")
    old.refresh_from_db()
    assert (old.state, old.replay_forced) == (DeadLetterState.REPLAYED, True)


def test_dry_run_says_what_would_happen_and_writes_nothing(settings):
    settings.VPAY_PROCESSED_JOBS_TTL_SECONDS = 7 * 86400
    fine = DeadLetterFactory()
    old = DeadLetterFactory(job_created_at=db_ago(days=8))
    out, _ = run("replay", str(fine.pk), str(old.pk), "--dry-run")
    assert f"would replay #{fine.pk}" in out
    assert f"would refuse #{old.pk}: is older than the processed_jobs fence TTL" in out
    assert out.splitlines()[-1] == "dry run: would replay 1, refuse 1; nothing written"
    out, _ = run("discard", str(fine.pk), "--reason", "x", "--dry-run")
    assert f"would discard #{fine.pk}" in out
    assert set(states().values()) == {"pending_review"}
    assert count("jobs") == 0


def test_a_discard_dry_run_names_the_letters_it_would_refuse_and_why():
    pending, replayed, discarded = DeadLetterFactory(), DeadLetterFactory(), DeadLetterFactory()
    run("replay", str(replayed.pk))
    run("discard", str(discarded.pk), "--reason", "closed")
    out, _ = run("discard", str(pending.pk), str(replayed.pk), str(discarded.pk), "--reason", "x", "--dry-run")
    assert f"would discard #{pending.pk}" in out
    assert f"would refuse #{replayed.pk}: was already replayed" in out
    assert f"would refuse #{discarded.pk}: is discarded" in out
    assert out.splitlines()[-1] == "dry run: would discard 1, refuse 2; nothing written"
    assert states() == {pending.pk: "pending_review", replayed.pk: "replayed", discarded.pk: "discarded"}


def test_an_unknown_id_is_reported_and_fails_the_command():
    letter = DeadLetterFactory()
    _, err, error = run_refused("replay", str(letter.pk), "999999")
    assert "#999999: does not exist" in err
    assert "1 of 2 refused" in error
    assert states()[letter.pk] == "replayed"  # the known one was still replayed


# --- discard ------------------------------------------------------------------------------


def test_discard_requires_a_reason_that_is_not_blank():
    letter = DeadLetterFactory()
    with pytest.raises(CommandError, match="--reason"):
        call_command("deadletters", "discard", str(letter.pk), stdout=io.StringIO(), stderr=io.StringIO())
    _, _, error = run_refused("discard", str(letter.pk), "--reason", "   ")
    assert "non-blank" in error
    assert states()[letter.pk] == "pending_review"


def test_discard_records_the_actor_and_the_trimmed_reason_and_refuses_replayed_letters():
    letter = DeadLetterFactory()
    replayed = DeadLetterFactory()
    ops.dead_letter_replay(letter_id=replayed.pk, actor="ops")
    out, err, _ = run_refused(
        "discard", str(letter.pk), str(replayed.pk), "--reason", " merchant refunded ", "--actor", "olga"
    )
    assert out.strip() == "discarded 1, refused 1"
    assert f"#{replayed.pk}: was already replayed" in err
    letter.refresh_from_db()
    assert (letter.state, letter.discarded_by, letter.discard_reason) == ("discarded", "olga", "merchant refunded")


# --- progress -----------------------------------------------------------------------------


def test_bulk_work_draws_a_progress_bar_on_stderr_only_when_asked_or_on_a_terminal():
    letters = [DeadLetterFactory() for _ in range(25)]
    out, err = run("replay", "--kind", "task", "--progress")
    assert out.strip() == "replayed 25, refused 0"
    assert "\rreplay [" + "#" * 30 + "] 25/25" in err
    assert err.endswith("\n")
    # Not a terminal (a StringIO, a pipe, a log file): no bar by default.
    more = [DeadLetterFactory(kind="sweep_expired", payload={}) for _ in range(25)]
    out, err = run("discard", "--kind", "sweep_expired", "--reason", "noise")
    assert out.strip() == "discarded 25, refused 0" and err == ""
    assert len(letters) + len(more) == DeadLetter.objects.count()


def test_the_real_command_exits_non_zero_with_a_message_when_something_is_refused():
    # A real process (exit code, stderr). It sees only committed rows, and this test's
    # transaction never commits: ask about an id that exists nowhere.
    proc = subprocess.run(
        [sys.executable, "manage.py", "deadletters", "replay", "424242"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "#424242: does not exist" in proc.stderr
    assert "CommandError: 1 id(s) not found" in proc.stderr


def test_acting_as_a_django_user_records_them_and_writes_the_admin_log(django_user_model):
    from django.contrib.admin.models import LogEntry

    django_user_model.objects.create_user(username="olga", password="x")
    letter = DeadLetterFactory()
    run("replay", str(letter.pk), "--user", "olga")
    letter.refresh_from_db()
    assert letter.replayed_by == "olga"
    entry = LogEntry.objects.get(object_id=str(letter.pk))
    assert entry.user.username == "olga" and entry.change_message.startswith("Replayed as job ")
    _, _, error = run_refused("discard", str(letter.pk), "--reason", "x", "--user", "nobody")
    assert "no such user" in error
