from django.apps import AppConfig


class ChargesConfig(AppConfig):
    name = "charges"
    verbose_name = "Charges"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # System checks and the job handlers (poll, resubmit, backstop) register on import.
        from charges import checks  # noqa: F401
        from charges.ceilings import rail_ceilings
        from charges.retention import old_provider_requests
        from charges.services import backstop_scan, polling, refund_polling, void_failed  # noqa: F401
        from charges.services.checkout_expiry import expire_checkout_sessions
        from customers.retention import register_in_use
        from jobs.maintenance.housekeeping import register_sweep_step
        from jobs.primitives.ceilings import register_ceilings
        from jobs.runner.warmup import register_warm_up

        register_ceilings("charges", rail_ceilings)
        register_warm_up("the rails' HTTP clients", _rail_clients)
        # Checkout sessions past 24 h expire in the hourly sweep_expired.
        register_sweep_step("checkout_sessions", expire_checkout_sessions)
        # Rail requests of settled charges, past their retention window.
        register_sweep_step("retention_provider_requests", old_provider_requests)

        # A customer with a payment in flight is not erased by the retention sweep. An
        # intent never confirmed is not in flight (and its creation already moved the
        # customer's last_used_at); a finished one keeps its record with customer NULL. An
        # authorization waiting for its capture is in flight.
        register_in_use(
            "payment_intents",
            "EXISTS (SELECT 1 FROM payment_intents p WHERE p.customer_id = customers.id"
            " AND p.status IN ('processing', 'requires_action', 'requires_capture'))",
        )


def _rail_clients() -> None:
    """Each configured rail's client (its TLS context, 20-30 ms to build), before a poll needs it."""
    from charges.rails import configured_rails
    from charges.rails.adapter import adapter_for

    for rail in configured_rails().values():
        adapter_for(rail)
