from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Events and webhooks"

    def ready(self) -> None:
        # Registering the job kinds and the system checks is a side effect of import.
        from jobs.maintenance.housekeeping import register_sweep_step
        from jobs.primitives.ceilings import register_ceilings
        from jobs.runner.warmup import register_warm_up
        from webhooks import bulk_resend, checks, handlers, retention  # noqa: F401
        from webhooks.ceilings import webhook_ceilings
        from webhooks.services import endpoint_health
        from webhooks.services.transport import default_ssl_context

        register_ceilings("webhooks", webhook_ceilings)
        register_warm_up("the webhook sender's TLS context", default_ssl_context)
        # Endpoint health, then retention (docs/webhooks.md, docs/housekeeping.md): hourly steps of sweep_expired.
        register_sweep_step("endpoint_health", endpoint_health.health_step)
        register_sweep_step("retention_deliveries", retention.old_deliveries)
        register_sweep_step("retention_events", retention.old_events)
