"""The ``/v1`` patterns the ``api`` app owns: the OAuth token endpoint, the API's own
description, then, last, any path no app matched answers a JSON 404."""

from django.urls import path, re_path

from api import oauth, openapi_view
from api.framework import unknown_route

urlpatterns = [
    path("oauth/token", oauth.token),
    path("openapi.json", openapi_view.openapi_json),
    re_path(r"^(?P<rest>.*)$", unknown_route),
]
