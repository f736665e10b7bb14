"""The error vocabulary shared by the worker and the web process.

Every failure is classified once, here, into a :class:`Classification`: a *category*
(what kind of failure), a *severity* (who needs to know) and a *retry* decision (what the
queue does about it). The worker's retry policy and the API's status codes are both
derived from it, so the two processes can never disagree about whether, say, a Postgres
blip is transient.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Category(enum.StrEnum):
    """What kind of failure this is."""

    TRANSIENT = "transient"  # may succeed if tried again later (timeouts, 5xx, blips)
    PERMANENT = "permanent"  # the far side refused for good; retrying changes nothing
    POISON = "poison"  # the work item itself is malformed (schema-invalid payload)
    CONFIGURATION = "configuration"  # our own setup is wrong (credentials refused)
    DEFERRED = "deferred"  # something shared is unhealthy; wait without spending an attempt
    BUG = "bug"  # an unexpected exception in our code


class Severity(enum.StrEnum):
    """Who needs to know: ``page`` wakes a human, ``error`` goes on the dashboard."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    PAGE = "page"


class Retry(enum.StrEnum):
    """What the queue does with a job that failed this way."""

    BACKOFF = "backoff"  # spend an attempt, retry after the kind's backoff
    DEFER = "defer"  # do not spend an attempt, retry after the given delay
    DEAD_LETTER = "dead_letter"  # no retry: straight to dead letters


@dataclass(frozen=True, slots=True)
class Classification:
    """The one answer every consumer of an error reads."""

    category: Category
    severity: Severity
    retry: Retry

    @property
    def alert(self) -> bool:
        """A line at this classification carries ``alert=true``."""
        return self.severity is Severity.PAGE


class VpayError(Exception):
    """Base of classified errors. Subclasses fix the classification."""

    classification = Classification(Category.BUG, Severity.ERROR, Retry.BACKOFF)


class TransientError(VpayError):
    """Try again later: timeouts, 5xx, a database blip."""

    classification = Classification(Category.TRANSIENT, Severity.WARNING, Retry.BACKOFF)


class PermanentError(VpayError):
    """The far side refused for good (a 4xx other than auth); no retry."""

    classification = Classification(Category.PERMANENT, Severity.ERROR, Retry.DEAD_LETTER)


class PoisonError(VpayError):
    """The work item can never succeed (schema-invalid payload, unknown kind)."""

    classification = Classification(Category.POISON, Severity.ERROR, Retry.DEAD_LETTER)


class UnrunnableHere(PoisonError):
    """This process cannot run the work item (a task path its release does not have), which a
    newer release's worker may: the runner leaves it for one, no attempt spent, and calls it
    poison only once no worker has run it for ``VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS``."""


class ConfigurationError(VpayError):
    """Our own configuration is wrong (credentials refused): page someone, no retry."""

    classification = Classification(Category.CONFIGURATION, Severity.PAGE, Retry.DEAD_LETTER)


class DeferError(VpayError):
    """Something shared is unhealthy (breaker open, rate limit): wait, spend no attempt."""

    classification = Classification(Category.DEFERRED, Severity.INFO, Retry.DEFER)

    def __init__(self, message: str = "deferred", *, delay_seconds: float = 30.0) -> None:
        super().__init__(message)
        self.delay_seconds = delay_seconds


def classify(exc: BaseException) -> Classification:
    """Classify any exception. Unknown exceptions are bugs, retried with backoff."""
    if isinstance(exc, VpayError):
        return exc.classification
    try:
        import psycopg
        from django.db import InterfaceError, OperationalError
    except ImportError:  # pragma: no cover - both are hard dependencies
        pass
    else:
        if isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError):
            return TransientError.classification
    try:
        import httpx
    except ImportError:  # pragma: no cover
        pass
    else:
        if isinstance(exc, httpx.TransportError):
            return TransientError.classification
    if isinstance(exc, TimeoutError | ConnectionError):
        return TransientError.classification
    return VpayError.classification


def error_chain(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message`` for the exception and every cause/context, bounded to ``limit``.

    The whole chain matters: "ConnectTimeout: ... <- OSError: connection refused" tells an
    operator what the top-level message alone does not.
    """
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}".rstrip(": "))
        # Follow what the traceback would show: an explicit cause, else the implicit
        # context unless `raise ... from None` suppressed it.
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    text = " <- ".join(parts)
    from vpay.logging import redact

    text = redact(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- Domain errors ------------------------------------------------------------------------
# What a service refuses, in the service's own words. Services raise these and know nothing
# of HTTP; ``api.errors`` maps each to a status and the API's error shape, the one place
# that does. ``message`` is for humans and never carries a secret; ``code`` is for machines;
# ``param`` names the offending input, if one does.


class DomainError(Exception):
    """A request a service refuses. Subclasses say what kind of refusal it is."""

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class InvalidInput(DomainError):
    """The input is malformed or out of bounds."""


class NotFound(DomainError):
    """No such object (or not the caller's)."""


class InvalidState(DomainError):
    """The object exists but is not in a state that allows this."""


class AuthenticationFailed(DomainError):
    """The credential is missing, malformed, unknown, expired, revoked or of the other mode."""


class RateLimited(DomainError):
    """Too many requests in the current window; ``retry_after`` seconds until the next."""

    def __init__(self, code: str, message: str, *, retry_after: int) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class Unavailable(DomainError):
    """A dependency is failing right now (a rail's breaker is open); nothing was done, and
    the same request may succeed after ``retry_after`` seconds."""

    def __init__(self, code: str, message: str, *, retry_after: int) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class GrantRefused(DomainError):
    """The token endpoint refuses (RFC 6749 §5.2): ``code`` is the RFC's ``error`` value
    (``invalid_request``, ``invalid_client``, ``invalid_grant``, ``unsupported_grant_type``)."""
