"""``GET /v1/openapi.json``: the API's description (``api.openapi``), unauthenticated and
cacheable. It is generated per request (the routes, the settings it names); the ETag lets a
client revalidate for a 304 instead of downloading it again."""

from __future__ import annotations

import hashlib
import json

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from api.framework import ApiError
from api.openapi import describe_api
from api.operations import Answer, Operation, describe

MAX_AGE_SECONDS = 300


@describe(
    Operation(
        "GET",
        "This description (OpenAPI 3.1), generated from the routes and their declarations.",
        public=True,
        operation_id="retrieve_openapi_description",
        responses={
            200: Answer("The description.", {"type": "object"}, headers={"ETag": {"type": "string"}}),
            304: Answer("Not modified since the ETag sent as If-None-Match."),
        },
    )
)
@csrf_exempt
def openapi_json(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return ApiError(405, "method_not_allowed", f"{request.method} is not allowed here.", allow=("GET",)).response()
    body = json.dumps(describe_api(), indent=1, sort_keys=False).encode()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    if etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
        response = HttpResponse(status=304)
    else:
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    response["Cache-Control"] = f"public, max-age={MAX_AGE_SECONDS}"
    return response
