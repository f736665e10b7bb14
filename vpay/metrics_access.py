"""Who may read ``/metrics`` on the web process.

The scrape shows request counts by view, database timings and the queue's state: not for
the public. ``VPAY_METRICS_TOKEN`` admits ``Authorization: Bearer <token>`` (compared in
constant time) and ``VPAY_METRICS_ALLOW_CIDRS`` admits the socket's peer address
(``REMOTE_ADDR``; never a forwarded header, which the client writes). Either admits. With
neither configured, development serves everyone (as before) and live mode answers 404:
the endpoint does not exist until an operator says who may read it.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import logging
from collections.abc import Sequence

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django_prometheus.exports import ExportToDjangoView

logger = logging.getLogger(__name__)


class Access(enum.Enum):
    ALLOW = "allow"
    NOT_FOUND = "not_found"  # live mode, nothing configured
    UNAUTHORIZED = "unauthorized"  # a token is configured and was not presented
    FORBIDDEN = "forbidden"  # only networks are configured and the peer is outside them


def metrics_access(
    *,
    live_mode: bool,
    token: str,
    cidrs: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
    authorization: str,
    remote_addr: str,
) -> Access:
    """The decision for one request. Pure over its inputs."""
    if not token and not cidrs:
        return Access.NOT_FOUND if live_mode else Access.ALLOW
    if token and _bearer_matches(authorization, token):
        return Access.ALLOW
    if cidrs and _peer_in(remote_addr, cidrs):
        return Access.ALLOW
    return Access.UNAUTHORIZED if token else Access.FORBIDDEN


def _bearer_matches(authorization: str, token: str) -> bool:
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def _peer_in(remote_addr: str, cidrs: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        address = ipaddress.ip_address(remote_addr)
    except ValueError:  # a Unix-socket peer ("") or anything unparsable is outside every network
        return False
    return any(address.version == net.version and address in net for net in cidrs)


def metrics_view(request: HttpRequest) -> HttpResponse:
    access = metrics_access(
        live_mode=settings.LIVE_MODE,
        token=settings.VPAY_METRICS_TOKEN,
        cidrs=settings.VPAY_METRICS_ALLOW_CIDRS,
        authorization=request.headers.get("Authorization", ""),
        remote_addr=request.META.get("REMOTE_ADDR", ""),
    )
    if access is Access.ALLOW:
        _refresh_sql_gauges()
        return ExportToDjangoView(request)
    if access is Access.NOT_FOUND:
        return HttpResponse("Not Found", status=404, content_type="text/plain")
    if access is Access.UNAUTHORIZED:
        return HttpResponse(
            "Unauthorized",
            status=401,
            content_type="text/plain",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    return HttpResponse("Forbidden", status=403, content_type="text/plain")


def _refresh_sql_gauges() -> None:
    """Gauges read from the database at scrape time (vpay.sql_gauges: the queue, the
    backlog waiting for operators, the breakers, the tables). A database that cannot answer
    leaves them as last read: the rest of the scrape is still worth serving."""
    from django.db import DatabaseError

    from vpay import sql_gauges

    try:
        sql_gauges.refresh()
    except DatabaseError:
        logger.warning("could not refresh the database gauges", exc_info=True)
