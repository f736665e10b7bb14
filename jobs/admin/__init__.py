"""The ops console (Django Admin) for the queue, one module per page family:

* ``base``: read-only admins and the two-step action with a reason;
* ``dead_letters``: replay, discard, and the bulk replay's entry (``bulk_replay``);
* ``queue``: live jobs (depth, cancel) and the fence's rows;
* ``alerts``: alerts and vendor breakers;
* ``bulk``: bulk operations and their progress;
* ``overview``: the last hour, drawn as charts.

Read-only everywhere except the actions (docs/ops-console.md).
"""

from jobs.admin import alerts, bulk, dead_letters, queue  # noqa: F401  (each registers its pages)
from jobs.admin.base import ReadOnlyAdmin

__all__ = ["ReadOnlyAdmin"]
