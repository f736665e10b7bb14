from django.urls import path

from webhooks import views

urlpatterns = [
    path("events", views.events),
    path("events/<str:event_id>", views.event),
]
