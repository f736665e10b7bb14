"""The ``/v1`` patterns the ``api`` app owns: the OAuth token endpoint, then, last, any path
no app matched answers a JSON 404."""

from django.urls import path, re_path

from api import oauth
from api.framework import unknown_route

urlpatterns = [
    path("oauth/token", oauth.token),
    re_path(r"^(?P<rest>.*)$", unknown_route),
]
