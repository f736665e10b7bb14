from django.apps import AppConfig


class CheckoutConfig(AppConfig):
    name = "checkout"
    verbose_name = "Hosted checkout page"
