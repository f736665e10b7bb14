from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path(settings.ADMIN_URL, admin.site.urls),
    path("", include("django_prometheus.urls")),  # /metrics
    # The merchant API. Each app adds its own include; api.urls stays last (the JSON 404).
    path("v1/", include("webhooks.urls")),
    path("v1/", include("customers.urls")),
    path("v1/", include("charges.urls")),
    path("v1/", include("api.urls")),
    # Rails' notifications: they only pull a charge's poll forward (charges/views.py).
    path("rails/", include("charges.rail_urls")),
]
