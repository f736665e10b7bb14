"""``python manage.py deadletters list|replay|discard``: the ops console's verbs from a shell.

The command parses and selects; :mod:`jobs.services.dead_letters` acts, each letter in its
own transaction, with the same guards as the admin (compare-and-swap on the state, the
fence horizon, a non-blank reason). All SQL is in :mod:`jobs.storage.repository`.
"""

from __future__ import annotations

import argparse
import getpass
import time
from datetime import datetime

from django.core.management.base import BaseCommand, CommandError

from jobs.bulk_models import BulkOperationKind
from jobs.models import DeadLetterState
from jobs.operator import bulk_watch
from jobs.operator import dead_letter_sql as operator_sql
from jobs.operator.durations import humanize_seconds, parse_time_bound
from jobs.services import bulk
from jobs.services import dead_letters as ops

# A bar is worth drawing only for work that takes a moment.
PROGRESS_MIN_ITEMS = 20


def parse_since(text: str) -> tuple[float | None, datetime | None]:
    """``--since``: a duration back from the database's now (``90s``, ``30m``, ``12h``, ``7d``)
    or an ISO-8601 instant with a timezone. Returns (seconds, None) or (None, instant)."""
    try:
        return parse_time_bound(text)
    except ValueError as exc:
        raise CommandError(f"--since {exc}") from None


class Progress:
    """A one-line progress bar on stderr (a Django ``OutputWrapper``), drawn only where someone
    watches (a terminal) and the work is long enough to need it; ``enabled`` overrides the guess."""

    WIDTH = 30

    def __init__(self, total: int, stream, *, enabled: bool | None = None, label: str = "") -> None:
        self.total, self.stream, self.label = total, stream, label
        if enabled is None:
            enabled = total >= PROGRESS_MIN_ITEMS and getattr(stream, "isatty", lambda: False)()
        self.enabled = enabled and total > 0
        self._last_draw = 0.0

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < self.total and now - self._last_draw < 0.1:  # at most ten redraws a second
            return
        self._last_draw = now
        filled = self.WIDTH * done // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{self.total}", ending="")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("")
            self.stream.flush()


class Command(BaseCommand):
    help = "List, replay or discard dead letters (the ops console's actions from a shell)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="verb", required=True, metavar="list|replay|discard")

        def common(p, *, acting: bool) -> None:
            p.add_argument("ids", nargs="*", type=int, help="Dead letter ids (default: select by the filters).")
            p.add_argument("--kind", action="append", default=[], help="Only this kind (repeatable).")
            p.add_argument("--queue", action="append", default=[], help="Only this queue (repeatable).")
            p.add_argument("--since", help="Created within a duration (30m, 12h, 7d) or since an ISO-8601 time.")
            p.add_argument("--limit", type=int, default=10_000, help="At most this many letters (default 10000).")
            if acting:
                p.add_argument(
                    "--all-pending",
                    action="store_true",
                    help="Act on every pending letter when no id or filter is given (a guard against accidents).",
                )
                p.add_argument("--dry-run", action="store_true", help="Say what would happen; write nothing.")
                p.add_argument("--actor", default="", help="Who is acting (default shell:<login name>).")
                p.add_argument(
                    "--user",
                    default="",
                    help="Act as this Django user: recorded as the actor and in the admin log (History).",
                )
                p.add_argument(
                    "--progress",
                    action=argparse.BooleanOptionalAction,
                    default=None,
                    help="Draw a progress bar on stderr (default: on a terminal, for 20 or more letters).",
                )

        listing = sub.add_parser("list", help="Show dead letters, newest first.")
        common(listing, acting=False)
        listing.add_argument(
            "--state",
            default=DeadLetterState.PENDING_REVIEW,
            choices=[*DeadLetterState.values, "all"],
            help="Review state (default pending_review).",
        )
        replay = sub.add_parser("replay", help="Re-enqueue pending letters with their own job_id.")
        common(replay, acting=True)
        replay.add_argument(
            "--bulk",
            action="store_true",
            help="Submit one bulk operation for every pending letter the filters match and return at once: "
            "the queue expands it (no ids, no --limit: it matches them all).",
        )
        replay.add_argument(
            "--wait",
            action="store_true",
            help="With --bulk: print the operation's progress until it is done.",
        )
        replay.add_argument("--timeout", type=float, default=None, help="With --wait: give up after these seconds.")
        replay.add_argument(
            "--force",
            action="store_true",
            help="Replay letters past the fence horizon too (their fence row may have expired: "
            "check first that their effect did not happen).",
        )
        discard = sub.add_parser("discard", help="Close pending letters for good, with a reason.")
        common(discard, acting=True)
        discard.add_argument("--reason", required=True, help="Why nobody needs to replay these (required).")

    def handle(self, *args, verb: str, **options):
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        since_seconds, since_at = parse_since(options["since"]) if options["since"] else (None, None)
        selection = {
            "ids": options["ids"] or None,
            "kinds": options["kind"] or None,
            "queues": options["queue"] or None,
            "since_seconds": since_seconds,
            "since_at": since_at,
            "limit": options["limit"],
        }
        if verb == "list":
            state = options["state"]
            letters = operator_sql.select_dead_letters(**selection, states=None if state == "all" else [state])
            self._print_table(letters)
            return
        filtered = any(selection[k] is not None for k in ("kinds", "queues", "since_seconds", "since_at"))
        if not options["ids"] and not filtered and not options["all_pending"]:
            raise CommandError(f"{verb}: give dead letter ids or a filter (--kind, --queue, --since), or --all-pending")
        if verb == "replay" and options["bulk"]:
            self._bulk_replay(options, since_seconds=since_seconds, since_at=since_at)
            return
        if verb == "replay" and (options["wait"] or options["timeout"] is not None):
            raise CommandError("replay: --wait and --timeout go with --bulk")
        reason = ""
        if verb == "discard":
            reason = ops.clean_reason(options["reason"])
            if not reason:
                raise CommandError("discard: --reason must contain non-blank text")
        # Explicit ids are taken in any state (and refused one by one, with the reason);
        # a filter selects only what is pending.
        states = None if options["ids"] else [DeadLetterState.PENDING_REVIEW]
        ids = [row.id for row in operator_sql.select_dead_letters(**selection, states=states)]
        missing = sorted(set(options["ids"]) - set(ids))
        for letter_id in missing:
            self.stderr.write(f"#{letter_id}: does not exist")
        if not ids:
            self.stdout.write(f"{verb}: no dead letter matches")
            if missing:
                raise CommandError(f"{len(missing)} id(s) not found")
            return
        ids.sort()
        if options["dry_run"]:
            self._dry_run(verb, ids, force=options.get("force", False))
            return
        user = _user(options["user"]) if options["user"] else None
        actor = options["actor"].strip() or (user.get_username() if user else f"shell:{_login_name()}")
        refused = self._act(
            verb,
            ids,
            actor=actor,
            force=options.get("force", False),
            reason=reason,
            progress=options,
            user_id=user.pk if user else None,
        )
        if refused or missing:
            raise CommandError(f"{verb}: {len(refused) + len(missing)} of {len(ids) + len(missing)} refused")

    def _bulk_replay(self, options: dict, *, since_seconds: float | None, since_at: datetime | None) -> None:
        """Submit the bulk replay (O(1): the envelope and its expansion job) and, with --wait, follow it."""
        if options["ids"] or options["dry_run"]:
            raise CommandError("replay --bulk selects by filters: give no ids and no --dry-run (use list to preview)")
        user = _user(options["user"]) if options["user"] else None
        actor = options["actor"].strip() or (user.get_username() if user else f"shell:{_login_name()}")
        try:
            operation_id = bulk.bulk_operation_submit(
                operation=BulkOperationKind.REPLAY_DEAD_LETTERS,
                filter={
                    "kinds": options["kind"] or None,
                    "queues": options["queue"] or None,
                    "since_seconds": since_seconds,
                    "since_at": since_at.isoformat() if since_at else None,
                },
                options={"force": options["force"]},
                actor=actor,
                user_id=user.pk if user else None,
            )
        except bulk.BulkRefused as exc:
            raise CommandError(f"replay --bulk: {exc}") from None
        self.stdout.write(f"submitted bulk operation #{operation_id} (replay_dead_letters)")
        if options["wait"]:
            progress = bulk_watch.watch(operation_id, self.stdout, timeout=options["timeout"])
            bulk_watch.report(progress, self.stderr, "replay")

    def _act(
        self, verb: str, ids: list[int], *, actor: str, force: bool, reason: str, progress: dict, user_id: int | None
    ) -> list:
        bar = Progress(len(ids), self.stderr, enabled=progress.get("progress"), label=verb)
        done: list = []
        refused: list = []
        try:
            for n, letter_id in enumerate(ids, 1):
                if verb == "replay":
                    result = ops.dead_letter_replay(letter_id=letter_id, actor=actor, force=force, user_id=user_id)
                else:
                    result = ops.dead_letter_discard(letter_id=letter_id, actor=actor, reason=reason, user_id=user_id)
                (done if result.done else refused).append(result)
                bar.update(n)
        finally:
            bar.close()
        for result in refused:
            self.stderr.write(f"#{result.id}: {result.message}")
        past = "replayed" if verb == "replay" else "discarded"
        self.stdout.write(f"{past} {len(done)}, refused {len(refused)}")
        return refused

    def _dry_run(self, verb: str, ids: list[int], *, force: bool) -> None:
        verdicts = ops.replay_preview(ids, force=force) if verb == "replay" else ops.discard_preview(ids)
        would = [i for i, refusal in verdicts.items() if refusal is None]
        for letter_id, refusal in verdicts.items():
            if refusal is None:
                self.stdout.write(f"would {verb} #{letter_id}")
            else:
                self.stdout.write(f"would refuse #{letter_id}: {ops.Result(letter_id, False, refusal).message}")
        self.stdout.write(f"dry run: would {verb} {len(would)}, refuse {len(verdicts) - len(would)}; nothing written")

    def _print_table(self, letters: list[operator_sql.LetterRow]) -> None:
        header = ("id", "state", "kind", "queue", "cause", "tries", "age", "correlation", "last error")
        rows = [
            (
                str(r.id),
                r.state,
                r.kind,
                r.queue,
                r.cause,
                str(r.attempts),
                humanize_seconds(r.age_seconds),
                r.correlation_id or "-",
                (r.error_excerpt.splitlines() or [""])[0],
            )
            for r in letters
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
        widths[-1] = 0  # the last column runs free
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        self.stdout.write(f"{len(rows)} dead letter{'s' if len(rows) != 1 else ''}")


def _user(username: str):
    from django.contrib.auth import get_user_model

    model = get_user_model()
    try:
        return model.objects.get(**{model.USERNAME_FIELD: username})
    except model.DoesNotExist:
        raise CommandError(f"--user {username!r}: no such user") from None


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid)
        return "unknown"
