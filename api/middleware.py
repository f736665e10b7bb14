"""What every ``/v1`` answer carries, whichever view (or Django itself) made it: a
``Request-Id`` header with a fresh id, also in every log line written while serving the
request (``vpay.request_context``) and in every error body (``api.framework.error_response``),
and the ``Vpay-Version`` the request was served in (``vpay.api_version``).

A ``Request-Id`` or ``X-Request-Id`` the client sends is ignored: the id is ours, so it is
unique and support can trust that one id names one request (docs/api.md, "Request ids").
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from vpay import api_version
from vpay.ids import new_id
from vpay.request_context import begin_request

REQUEST_ID_HEADER = "Request-Id"


def is_api(request: HttpRequest) -> bool:
    return request.path == "/v1" or request.path.startswith("/v1/")


class ApiRequestMiddleware:
    """First in ``MIDDLEWARE``, so the answers of the middlewares after it (a refused
    ``Host``) carry the id too."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not is_api(request):
            return self.get_response(request)
        request_id = new_id("req")
        begin_request(request_id)
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request_id
        version = api_version.requested(request.headers)
        if version is not None:
            response[api_version.HEADER] = version
        return response
