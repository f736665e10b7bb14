"""Handlers, registered per :class:`~jobs.kinds.JobKind`, with what the loop needs to run them.

Apps register in their ``AppConfig.ready()`` (by importing the module that calls
:func:`register`). ``jobs`` imports no app: dependencies point at the queue, never from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobs.kinds import JobKind
from jobs.primitives.retry import DEFAULT_RETRY, RetryPolicy
from jobs.primitives.schema import PayloadSchema

if TYPE_CHECKING:
    from jobs.runner.context import JobContext
    from jobs.runner.outcome import Outcome

# What a lease adds on top of a kind's timeout: the handler gives up (timeout) well before
# anyone else may take the job over (lease expiry), so a slow handler is not run twice.
LEASE_MARGIN_SECONDS = 30.0
DEFAULT_MAX_DEFERRALS = 100


@dataclass(frozen=True)
class Singleton:
    """A kind with exactly one live job, seeded at worker boot under a fixed dedupe key.

    The period is the handler's own: it answers ``Outcome.reschedule_in(period)``, so the
    same row lives on (one place says how often, not two).
    """

    payload: dict = field(default_factory=dict)

    def dedupe_key(self, kind: str) -> str:
        return f"singleton:{kind}"


@dataclass(frozen=True)
class KindSpec:
    kind: JobKind
    handler: Callable[[JobContext], Outcome]
    schema: PayloadSchema
    timeout_seconds: float
    retry: RetryPolicy | Callable[[], RetryPolicy] = DEFAULT_RETRY  # read by retry_policy()
    max_deferrals: int = DEFAULT_MAX_DEFERRALS
    singleton: Singleton | None = None
    # The loop runs a fenced handler inside one transaction together with the job's
    # processed_jobs row and the job's own delete: effect, fence and finish commit together
    # or not at all. The handler must not commit on its own (nested atomic blocks are fine)
    # and cannot heartbeat (its transaction is not visible); its timeout sits under the lease.
    fenced: bool = False
    # What the job acts on, stored on its fence row (see ProcessedJob.subject).
    subject: Callable[[dict], str] | None = None
    # Why an operator may not cancel this kind's jobs (jobs.services.cancels), or None when
    # they may: the refusal quotes it, so it says what to do instead.
    not_cancellable: str | None = None
    # How long it runs is set by a merchant's server (a webhook delivery): such kinds may hold
    # at most --concurrency minus VPAY_WORKER_RESERVED_EXECUTORS executors of a worker, so
    # however slow the merchants' servers, the rest stay for everything else, the money
    # kinds first among it (a charge's poll never waits behind slow webhooks).
    merchant_paced: bool = False

    @property
    def cancellable(self) -> bool:
        return self.not_cancellable is None

    @property
    def lease_seconds(self) -> float:
        """The lease a claim takes on this kind: its timeout plus a margin."""
        return self.timeout_seconds + LEASE_MARGIN_SECONDS


_REGISTRY: dict[str, KindSpec] = {}


def register(
    kind: JobKind,
    *,
    schema: PayloadSchema,
    timeout_seconds: float,
    retry: RetryPolicy | Callable[[], RetryPolicy] = DEFAULT_RETRY,
    max_deferrals: int = DEFAULT_MAX_DEFERRALS,
    singleton: Singleton | None = None,
    fenced: bool = False,
    subject: Callable[[dict], str] | None = None,
    cancellable: bool = True,
    not_cancellable_reason: str = "",
    merchant_paced: bool = False,
) -> Callable[[Callable[[JobContext], Outcome]], Callable[[JobContext], Outcome]]:
    """Register the decorated function as the handler of ``kind``.

    ``retry`` may be a callable read at use time (for policies that come from settings).
    ``cancellable=False`` where cancelling is wrong, with ``not_cancellable_reason`` saying
    why and what the operator does instead.
    """
    if cancellable == bool(not_cancellable_reason.strip()):
        raise ValueError(f"kind {kind.value!r}: a reason is given exactly when it is not cancellable")
    refusal = None if cancellable else not_cancellable_reason.strip()

    def decorate(handler: Callable[[JobContext], Outcome]) -> Callable[[JobContext], Outcome]:
        if kind.value in _REGISTRY:
            raise RuntimeError(f"kind {kind.value!r} is already registered")
        spec = KindSpec(
            kind, handler, schema, timeout_seconds, retry, max_deferrals, singleton, fenced, subject, refusal, merchant_paced
        )
        _REGISTRY[kind.value] = spec
        return handler

    return decorate


def get(kind: str) -> KindSpec | None:
    return _REGISTRY.get(kind)


def is_fenced(kind: str) -> bool:
    """Whether ``kind`` is fenced by the loop: its job_id is processed once, so a finished job
    of it is never run again under that id (not even when woken while it ran)."""
    spec = _REGISTRY.get(kind)
    return spec is not None and spec.fenced


def retry_policy(spec: KindSpec) -> RetryPolicy:
    return spec.retry() if callable(spec.retry) else spec.retry


def all_specs() -> list[KindSpec]:
    return list(_REGISTRY.values())


def registered_kinds() -> set[str]:
    return set(_REGISTRY)
