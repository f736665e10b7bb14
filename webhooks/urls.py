from django.urls import path

from webhooks import views

urlpatterns = [
    path("events", views.events),
    path("events/<str:event_id>", views.event),
    path("webhook_endpoints", views.webhook_endpoints),
    path("webhook_endpoints/<str:endpoint_id>", views.webhook_endpoint),
    path("webhook_endpoints/<str:endpoint_id>/rotate_secret", views.rotate_webhook_secret),
    path("webhook_endpoints/<str:endpoint_id>/disable", views.disable_webhook_endpoint),
    path("webhook_endpoints/<str:endpoint_id>/enable", views.enable_webhook_endpoint),
    path("webhook_endpoints/<str:endpoint_id>/test", views.send_test_event),
    path("webhook_endpoints/<str:endpoint_id>/deliveries", views.webhook_deliveries),
    path("webhook_endpoints/<str:endpoint_id>/deliveries/<str:delivery_id>/retry", views.retry_webhook_delivery),
    path("event_types", views.event_types),
]
