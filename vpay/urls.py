from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from vpay.metrics_access import metrics_view

urlpatterns = [
    path(settings.ADMIN_URL, admin.site.urls),
    # django-prometheus' export, behind VPAY_METRICS_TOKEN / VPAY_METRICS_ALLOW_CIDRS.
    path("metrics", metrics_view, name="prometheus-django-metrics"),
    # The merchant API. Each app adds its own include; api.urls stays last (the JSON 404).
    path("v1/", include("webhooks.urls")),
    path("v1/", include("customers.urls")),
    path("v1/", include("charges.urls")),
    path("v1/", include("api.urls")),
    # Rails' notifications: they only pull a charge's poll forward (charges/views.py).
    path("rails/", include("charges.rail_urls")),
]
