from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from api.framework import unknown_route
from vpay.metrics_access import metrics_view
from vpay.overview.views import overview

# What Django itself refuses (a disallowed Host, an error raised outside any view) answers
# in the API's JSON error format under /v1 and as Django's own page elsewhere.
handler400 = "api.handlers.bad_request"
handler403 = "api.handlers.permission_denied"
handler404 = "api.handlers.page_not_found"
handler500 = "api.handlers.server_error"

urlpatterns = [
    # The ops console's overview charts (vpay/overview), behind the admin's own login.
    path(f"{settings.ADMIN_URL}overview/", admin.site.admin_view(overview), name="admin-overview"),
    path(settings.ADMIN_URL, admin.site.urls),
    # django-prometheus' export, behind VPAY_METRICS_TOKEN / VPAY_METRICS_ALLOW_CIDRS.
    path("metrics", metrics_view, name="prometheus-django-metrics"),
    # The merchant API. Each app adds its own include; api.urls stays last (the JSON 404).
    path("v1/", include("webhooks.urls")),
    path("v1/", include("customers.urls")),
    path("v1/", include("charges.urls")),
    path("v1/", include("api.urls")),
    path("v1", unknown_route),  # resolved here, so APPEND_SLASH never redirects it (a POST would lose its body)
    # The hosted checkout page a checkout session's url points to (VPAY_CHECKOUT_BASE_URL).
    path("checkout/", include("checkout.urls")),
    # Rails' notifications: they only pull a charge's poll forward (charges/views.py).
    path("rails/", include("charges.rail_urls")),
]
