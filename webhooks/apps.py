from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Events and webhooks"

    def ready(self) -> None:
        # Registering the job kinds and the system checks is a side effect of import.
        from jobs.ceilings import register_ceilings
        from webhooks import bulk_resend, checks, handlers  # noqa: F401
        from webhooks.ceilings import webhook_ceilings

        register_ceilings("webhooks", webhook_ceilings)
