from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "Merchant API"

    def ready(self) -> None:
        # Expired idempotency records leave through the hourly sweep.
        from api import idempotency
        from jobs.housekeeping import register_sweep_step

        register_sweep_step("idempotency_records", idempotency.sweep_expired_records)
