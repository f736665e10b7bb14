"""Django's error handlers (``vpay.urls``): the common JSON error format for ``/v1``.

Every ``/v1`` view answers its own refusals through ``api.framework.route``; these cover
what Django refuses before or around a view (a ``Host`` header not in ``ALLOWED_HOSTS``,
an exception raised by a middleware). Any other path gets Django's default page.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views import defaults

from api.framework import API, error_response


def _is_api(request: HttpRequest) -> bool:
    return request.path == "/v1" or request.path.startswith("/v1/")


def bad_request(request: HttpRequest, exception: Exception, template_name: str = "400.html") -> HttpResponse:
    if _is_api(request):
        # Never the exception's text: a DisallowedHost message echoes the header it refused.
        return error_response(400, "invalid_request", "The request could not be understood.")
    return defaults.bad_request(request, exception, template_name)


def permission_denied(request: HttpRequest, exception: Exception, template_name: str = "403.html") -> HttpResponse:
    if _is_api(request):
        return error_response(403, "forbidden", "This request is not allowed.")
    return defaults.permission_denied(request, exception, template_name)


def page_not_found(request: HttpRequest, exception: Exception, template_name: str = "404.html") -> HttpResponse:
    if _is_api(request):
        return error_response(404, "route_missing", f"Unrecognized request URL ({request.method}: {request.path}).")
    return defaults.page_not_found(request, exception, template_name)


def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    if _is_api(request):
        return error_response(500, "internal_error", "An internal error occurred.", type=API)
    return defaults.server_error(request, template_name)
