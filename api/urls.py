"""The last ``/v1`` patterns: any path no app matched answers a JSON 404."""

from django.urls import re_path

from api.framework import unknown_route

urlpatterns = [re_path(r"^(?P<rest>.*)$", unknown_route)]
