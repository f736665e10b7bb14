from django.apps import AppConfig


class ChargesConfig(AppConfig):
    name = "charges"
    verbose_name = "Charges"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # System checks (and, once the worker side exists, job handlers) register on import.
        from charges import checks  # noqa: F401
