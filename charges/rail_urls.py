from django.urls import path

from charges import views

urlpatterns = [path("<str:code>/callback", views.rail_callback)]
