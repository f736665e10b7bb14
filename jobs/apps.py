import logging

from django.apps import AppConfig
from django.conf import settings


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Job queue"

    def ready(self) -> None:
        # Registering the queue's own kinds and its system checks is a side effect of import.
        from jobs import checks  # noqa: F401
        from jobs.adapters import tasks_backend  # noqa: F401
        from jobs.maintenance import housekeeping, retention
        from jobs.operator import alerts, bulk_replay  # noqa: F401
        from jobs.primitives import expansion  # noqa: F401

        # Retention of the queue's own evidence (docs/housekeeping.md "Retention").
        housekeeping.register_sweep_step("retention_dead_letters", retention.settled_dead_letters)
        housekeeping.register_sweep_step("retention_alerts", retention.old_alerts)

        if settings.VPAY_QUEUE_ADAPTER == "inprocess":
            from jobs.adapters.inprocess import NOT_DURABLE

            # Said at every start, so nobody mistakes a development process for a durable one.
            logging.getLogger("jobs.adapters.inprocess").warning(NOT_DURABLE, extra={"alert": True})
