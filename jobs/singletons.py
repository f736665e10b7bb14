"""Seeding the singleton jobs: one live row per singleton kind, however many workers boot."""

from __future__ import annotations

import logging

from jobs import queue, registry

logger = logging.getLogger(__name__)


def seed_singletons() -> list[str]:
    """Enqueue every registered singleton under its fixed dedupe key; returns the kinds seeded now.

    ``ON CONFLICT DO NOTHING`` on the dedupe key makes this safe to run from every worker
    at every boot: the live row, wherever it is in its schedule, is left alone.
    """
    seeded = []
    for spec in registry.all_specs():
        if spec.singleton is None:
            continue
        if queue.enqueue(spec.kind, spec.singleton.payload, dedupe_key=spec.singleton.dedupe_key(spec.kind.value)):
            seeded.append(spec.kind.value)
    if seeded:
        logger.info("seeded singleton jobs", extra={"kinds": ",".join(seeded)})
    return seeded
