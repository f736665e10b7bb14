from django.apps import AppConfig


class MerchantsConfig(AppConfig):
    name = "merchants"
    verbose_name = "Merchants"

    def ready(self) -> None:
        # Expired assertion jtis and access tokens leave through the hourly sweep.
        from jobs.maintenance.housekeeping import register_sweep_step
        from merchants import sweeps

        register_sweep_step("oauth_assertion_jtis", sweeps.sweep_expired_jtis)
        register_sweep_step("oauth_access_tokens", sweeps.sweep_expired_access_tokens)
