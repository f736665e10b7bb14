"""Seeding the singleton jobs: one live row per singleton kind, however many workers boot."""

from __future__ import annotations

import logging

from django.db import connection

from jobs import registry
from jobs.adapters import postgres as queue
from jobs.models import DeadLetterCause, DeadLetterState

logger = logging.getLogger(__name__)

# Singletons buried for killing their workers (the reaper's dead letters, still waiting for an
# operator): re-seeding one would start it again at the row that kills workers, and the
# recovery cap would never stop it. Index jobs_deadletter_review_idx (state first); the
# pending letters are few.
_BURIED_FOR_CRASHES = """
SELECT DISTINCT dedupe_key FROM dead_letters
 WHERE state = %(pending)s AND cause = ANY(%(causes)s) AND dedupe_key = ANY(%(keys)s)
"""
_CRASH_CAUSES = [DeadLetterCause.NO_PROGRESS.value, DeadLetterCause.CRASHED_WORKER.value]


def seed_singletons() -> list[str]:
    """Enqueue every registered singleton under its fixed dedupe key; returns the kinds seeded now.

    ``ON CONFLICT DO NOTHING`` on the dedupe key makes this safe to run from every worker
    at every boot: the live row, wherever it is in its schedule, is left alone. A singleton
    whose dead letter says it killed its workers (``no_progress``, ``crashed_worker``) is
    not seeded again until an operator replays or discards that letter (its alert says so):
    the reaper buried it so that it stops.
    """
    specs = {spec.singleton.dedupe_key(spec.kind.value): spec for spec in registry.all_specs() if spec.singleton}
    with connection.cursor() as cursor:
        cursor.execute(
            _BURIED_FOR_CRASHES,
            {"pending": DeadLetterState.PENDING_REVIEW.value, "causes": _CRASH_CAUSES, "keys": list(specs)},
        )
        buried = {key for (key,) in cursor.fetchall()}
    seeded = []
    for key, spec in specs.items():
        if key in buried:
            continue
        assert spec.singleton is not None  # specs holds singleton kinds only
        if queue.enqueue(spec.kind, spec.singleton.payload, dedupe_key=key):
            seeded.append(spec.kind.value)
    if seeded:
        logger.info("seeded singleton jobs", extra={"kinds": ",".join(seeded)})
    return seeded
