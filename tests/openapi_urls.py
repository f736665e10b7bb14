"""A URLconf for tests/test_openapi.py: the real one plus one route no shipping code has,
to show that routing a view is all it takes to be described."""

from django.http import JsonResponse
from django.urls import include, path

from api.framework import Body, Field, route
from api.operations import Operation
from api.schemas import ref
from vpay.urls import urlpatterns as real_patterns

PING = Body(note=Field(str, max_length=10))


@route(Operation("POST", "A route only this test routes.", body=PING, answers=ref("customer")), "GET")
def ping(request):
    PING.parse(request)
    return JsonResponse({})


urlpatterns = [path("v1/", include([path("pings/<str:ping_id>", ping)])), *real_patterns]
