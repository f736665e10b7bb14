"""Lists: a page of a queryset, newest first, by cursor, both ways, with the ``created``
window (``api.params.LIST`` declares the parameters; the views pass ``request.query``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.http import JsonResponse

from api.framework import DEFAULT_PAGE, ApiRequest, M, not_found, respond


def paginate(
    request: ApiRequest,
    queryset: QuerySet[M],
    render: Callable[[M], dict],
    params: dict[str, Any],
    *,
    scope: QuerySet | None = None,
    cursor: Callable[[str], dict[str, Any] | None] | None = None,
) -> JsonResponse:
    """A page of ``queryset``, newest first, as ``{"object": "list", "data", "has_more"}``.

    ``params`` are the view's cleaned list parameters (``api.params.LIST``, or a list's
    extension of it, on ``request.query``): ``limit``, one cursor, and the ``created``
    window. ``created`` is rendered in whole seconds, so ``created[gte]=T`` keeps rows from
    the instant T on and ``created[lte]=T`` rows before T+1: an object whose ``created`` is
    T is inside both bounds.

    The cursor is an object id. ``starting_after`` gives what comes after it in
    (``created_at``, ``id``) descending order; ``ending_before`` the page just before it,
    read ascending from the cursor and handed out in the same newest-first order, its
    ``has_more`` saying whether there is more in that direction (newer). So pages neither
    skip nor repeat rows when new ones are created between requests. The model needs
    ``created_at`` and an ``id``.

    The cursor is found among all of ``scope``'s rows (by default the merchant's rows of the
    model), not inside ``queryset``: the last object of a page may have left the filter
    since (an intent that succeeded, an endpoint deleted), and its position still says
    where the next page starts. ``cursor`` turns a wire id into the lookup that finds its
    row (``{"public_id": …}`` where the wire id is not the primary key; None: no such
    object, the 404 an unknown id gets); the order is (``created_at``, primary key) either
    way, so a wire id need not sort.
    """
    limit = params.get("limit", DEFAULT_PAGE)
    if (gte := params.get("created[gte]")) is not None:
        queryset = queryset.filter(created_at__gte=_instant(gte))
    if (lte := params.get("created[lte]")) is not None:
        queryset = queryset.filter(created_at__lt=_instant(lte + 1))
    after, before = params.get("starting_after"), params.get("ending_before")
    wire_id = after if after is not None else before
    if wire_id is not None:
        if scope is None:
            scope = queryset.model._default_manager.filter(merchant=request.merchant)
        lookup = cursor(wire_id) if cursor is not None else {"id": wire_id}
        found = None if lookup is None else scope.filter(**lookup).values_list("created_at", "id").first()
        if found is None:
            raise not_found("object", wire_id)
        anchor, key = found
    # Each cursor also bounds created_at alone: that bound is an index condition, so the scan
    # starts at the cursor instead of walking every newer (older) row to reach it.
    if before is not None:
        queryset = queryset.filter(Q(created_at__gt=anchor) | Q(created_at=anchor, id__gt=key), created_at__gte=anchor)
        rows = list(queryset.order_by("created_at", "id")[: limit + 1])
        page = rows[:limit][::-1]
    else:
        if after is not None:
            queryset = queryset.filter(
                Q(created_at__lt=anchor) | Q(created_at=anchor, id__lt=key), created_at__lte=anchor
            )
        rows = list(queryset.order_by("-created_at", "-id")[: limit + 1])
        page = rows[:limit]
    return respond(
        {
            "object": "list",
            "url": request.path,
            "has_more": len(rows) > limit,
            "data": [render(row) for row in page],
        }
    )


def _instant(unix_seconds: int) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)
