"""The id of the ``/v1`` request being served, for every log line written while serving it.

``api.middleware`` sets it when a ``/v1`` request arrives; it is cleared when the answer has
been sent (``request_finished``), not when the middleware returns, because Django logs a
4xx or 5xx (``django.request``) after the middleware chain has returned.
``vpay.logging.RequestIdFilter`` copies it onto each record.
"""

from __future__ import annotations

from contextvars import ContextVar

from django.core.signals import request_finished

_request_id: ContextVar[str | None] = ContextVar("vpay_request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request this thread (or task) is serving, else None."""
    return _request_id.get()


def begin_request(request_id: str) -> None:
    _request_id.set(request_id)


def _end_request(**_kwargs: object) -> None:
    _request_id.set(None)


request_finished.connect(_end_request, dispatch_uid="vpay.request_context.end_request")
