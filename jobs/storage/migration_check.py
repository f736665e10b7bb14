"""Refuse to run against a schema this code does not match."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migration_problems() -> list[str]:
    """Unapplied migrations (code ahead of the database) and unknown ones (database ahead)."""
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    unapplied = [f"{m.app_label}.{m.name}" for m, _ in executor.migration_plan(graph.leaf_nodes())]
    unknown = sorted(
        f"{app}.{name}" for app, name in executor.loader.applied_migrations if (app, name) not in graph.nodes
    )
    problems = []
    if unapplied:
        problems.append(f"unapplied migrations: {', '.join(unapplied)} (run `python manage.py migrate`)")
    if unknown:
        problems.append(
            f"the database has migrations this code does not know: {', '.join(unknown)} "
            "(is this an older release than the one that migrated the database?)"
        )
    return problems
