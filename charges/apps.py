from django.apps import AppConfig


class ChargesConfig(AppConfig):
    name = "charges"
    verbose_name = "Charges"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # System checks and the job handlers (poll, resubmit, backstop) register on import.
        from charges import checks  # noqa: F401
        from charges.services import polling  # noqa: F401
