from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Job queue"

    def ready(self) -> None:
        # Registering the queue's own kinds and its system checks is a side effect of import.
        from jobs import alerts, checks, housekeeping, tasks_backend  # noqa: F401
