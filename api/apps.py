from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "Merchant API"

    def ready(self) -> None:
        # Expired idempotency records and idle rate-limit keys leave through the hourly sweep.
        from api import idempotency, ratelimit
        from jobs.maintenance.housekeeping import register_sweep_step

        register_sweep_step("idempotency_records", idempotency.sweep_expired_records)
        register_sweep_step("rate_limit_keys", ratelimit.sweep_stale_windows)
