from django.apps import AppConfig


class CustomersConfig(AppConfig):
    name = "customers"
    verbose_name = "Customers"

    def ready(self) -> None:
        from customers import retention  # noqa: F401  (registers sweep_idle_customers)
