"""Every ceiling the runner works under, with where each value came from, in one list.

A ceiling that is easy to set and hard to find (a deployment's env var, a setting's
default, a kind's registration, a number derived from another) is read here, in the
order an operator looks for them: the worker's own (concurrency, prefetch, queues, the
fair claim's tenant walk, heartbeat and lease, grace), then the shared ones the apps
contribute (rails, webhook endpoints, breakers, recovery caps), then each kind's
(attempts, timeout, deferrals). Three places show the same list:

* ``python manage.py runworker --print-config`` (a table, or ``--format json``);
* the worker's ``worker started`` log line;
* the gauges ``vpay_ceiling{name=...}`` on the worker's ``/metrics`` (numeric ones).

A source is ``flag --x``, ``env VPAY_X`` (a runworker option read from the environment, or
a setting whose variable is set), ``setting VPAY_X`` (a setting at its value in
vpay/settings.py), ``default``, ``derived: …`` or ``kind registration (module)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from django.conf import settings

from jobs import registry

if TYPE_CHECKING:
    from jobs.runner.worker import Worker


@dataclass(frozen=True, slots=True)
class Ceiling:
    name: str
    value: int | float | str
    source: str


# The cores this process may run on (its CPU affinity, which a container's cpuset narrows).
MACHINE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

# runworker's options: (flag, env var, default, parse). The env var is the deployment's
# knob (a container's environment); the flag wins over it; the default is the runner's.
_OPTIONS: dict[str, tuple[str, str | None, object, Callable[[str], object]]] = {
    "concurrency": ("--concurrency", "VPAY_WORKER_CONCURRENCY", 4, int),
    # A process per core: one worker's Python runs on one core at a time (bench/RESULTS.md,
    # "Cost per job": two processes of 16 drained the no-op backlog 1.4-1.75x faster than one).
    "processes": ("--processes", "VPAY_WORKER_PROCESSES", MACHINE_CORES, int),
    "queues": ("--queues", "VPAY_WORKER_QUEUES", "default", str),
    "heartbeat": ("--heartbeat", "VPAY_WORKER_HEARTBEAT_SECONDS", 5.0, float),
    "grace": ("--grace", "VPAY_WORKER_GRACE_SECONDS", 30.0, float),
}
# Tenants the fair claim walks per claim (jobs.storage.leases.CLAIM); a Worker argument, no flag.
MAX_TENANTS = 64


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """runworker's effective options, each with its source."""

    values: Mapping[str, object]
    sources: Mapping[str, str]


def worker_options(flags: Mapping[str, object], environ: Mapping[str, str] = os.environ) -> WorkerOptions:
    """Resolve runworker's options: a flag given (not None) wins, then the env var, then the default.

    An env var that does not parse raises ``ValueError`` naming it (runworker reports it).
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for key, (flag, env_name, default, parse) in _OPTIONS.items():
        if flags.get(key) is not None:
            values[key], sources[key] = flags[key], f"flag {flag}"
        elif env_name and environ.get(env_name, "").strip():
            try:
                values[key] = parse(environ[env_name].strip())
            except ValueError:
                raise ValueError(f"{env_name}={environ[env_name]!r} is not a valid {parse.__name__}") from None
            sources[key] = f"env {env_name}"
        else:
            values[key], sources[key] = default, "default"
    return WorkerOptions(values, sources)


def setting(name: str, label: str | None = None) -> Ceiling:
    """A ceiling held in a setting: ``env VPAY_X`` when its variable is set, else ``setting VPAY_X``."""
    source = f"env {name}" if os.environ.get(name, "").strip() else f"setting {name}"
    return Ceiling(label or name, getattr(settings, name), source)


@dataclass(frozen=True, slots=True)
class Scope:
    """What an app's contribution may depend on: the worker's executor count."""

    concurrency: int | None
    concurrency_source: str


_CONTRIBUTIONS: dict[str, Callable[[Scope], list[Ceiling]]] = {}


def reserved_executors(concurrency: int) -> int:
    """Executors of a worker that the merchant-paced kinds (registry ``merchant_paced``: a
    webhook delivery) may never hold, kept for everything else, the money kinds first:
    ``VPAY_WORKER_RESERVED_EXECUTORS``, or a quarter of ``concurrency`` (at least 1); never
    all of them (the other kinds need one)."""
    configured = settings.VPAY_WORKER_RESERVED_EXECUTORS
    wanted = max(1, concurrency // 4) if configured < 0 else configured
    return max(0, min(wanted, concurrency - 1))


def register_ceilings(name: str, contribute: Callable[[Scope], list[Ceiling]]) -> None:
    """An app's ceilings (rails, webhook endpoints), registered in its ``AppConfig.ready()``:
    ``jobs`` imports no app, so the apps bring their numbers to it."""
    _CONTRIBUTIONS[name] = contribute


def collect(
    *,
    concurrency: int,
    queues: list[str] | str,
    heartbeat_seconds: float,
    lease_seconds: float,
    grace_seconds: float,
    max_tenants: int = MAX_TENANTS,
    sources: Mapping[str, str] | None = None,
) -> list[Ceiling]:
    """Every ceiling, in reading order (see the module docstring)."""
    src = dict(sources or {})
    arg = "Worker argument"
    queues_text = queues if isinstance(queues, str) else ",".join(queues)
    found = [
        Ceiling("worker.concurrency", concurrency, src.get("concurrency", arg)),
        Ceiling("worker.prefetch", 0, "fixed: the runner claims only for idle executors"),
        Ceiling(
            "worker.reserved_executors",
            reserved_executors(concurrency),
            "env VPAY_WORKER_RESERVED_EXECUTORS"
            if settings.VPAY_WORKER_RESERVED_EXECUTORS >= 0
            else "derived: a quarter of the concurrency, at least 1, never all (webhooks never hold them)",
        ),
        Ceiling("worker.queues", queues_text, src.get("queues", arg)),
        Ceiling("claim.max_tenants_per_claim", max_tenants, src.get("max_tenants", "default")),
        Ceiling("worker.heartbeat_seconds", heartbeat_seconds, src.get("heartbeat", arg)),
        Ceiling("worker.lease_seconds", lease_seconds, "derived: 2 heartbeats + 2 s"),
        Ceiling("worker.grace_seconds", grace_seconds, src.get("grace", arg)),
        setting("VPAY_JOB_RECOVERY_CAP", "jobs.recovery_cap"),  # rescues without progress (jobs/maintenance/reaper.py)
        # how long work this release cannot run waits for a worker that can (jobs/maintenance/unclaimable.py)
        setting("VPAY_JOB_UNRUNNABLE_WINDOW_SECONDS", "jobs.unrunnable_window_seconds"),
    ]
    scope = Scope(concurrency, src.get("concurrency", arg))
    for name in sorted(_CONTRIBUTIONS):
        found.extend(_CONTRIBUTIONS[name](scope))
    for spec in sorted(registry.all_specs(), key=lambda s: s.kind.value):
        found.extend(kind_ceilings(spec))
    return found


def kind_ceilings(spec: registry.KindSpec) -> list[Ceiling]:
    """A kind's retry ceiling, timeout and deferral ceiling, from its registration."""
    where = f"kind registration ({spec.handler.__module__})"
    retry_where = f"{where}, a policy read from settings at use" if callable(spec.retry) else where
    prefix = f"kind.{spec.kind.value}"
    return [
        Ceiling(f"{prefix}.max_attempts", registry.retry_policy(spec).max_attempts, retry_where),
        Ceiling(f"{prefix}.timeout_seconds", spec.timeout_seconds, where),
        Ceiling(f"{prefix}.max_deferrals", spec.max_deferrals, where),
    ]


def of_worker(worker: Worker) -> list[Ceiling]:
    """The ceilings of a constructed worker; sources from runworker when it recorded them
    (``worker.option_sources``), else "Worker argument"."""
    return collect(
        concurrency=worker.concurrency,
        queues=worker.queues,
        heartbeat_seconds=worker.heartbeat_seconds,
        lease_seconds=worker.lease_seconds,
        grace_seconds=worker.grace_seconds,
        max_tenants=worker.max_tenants,
        sources=getattr(worker, "option_sources", None),
    )


def publish(worker: Worker) -> dict[str, int | float | str]:
    """Set the ``vpay_ceiling`` gauges from ``worker``'s ceilings and return them as
    ``{name: value}`` for its ``worker started`` log line."""
    from vpay import metrics

    found = of_worker(worker)
    for ceiling in found:
        if is_numeric(ceiling.value):
            metrics.CEILING.labels(name=ceiling.name).set(ceiling.value)
    return {c.name: c.value for c in found}


def is_numeric(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_table(found: list[Ceiling]) -> str:
    """A readable table: name, value, source, aligned."""
    rows = [("ceiling", "value", "source")] + [(c.name, _text(c.value), c.source) for c in found]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]}".rstrip() for r in rows)


def as_dicts(found: list[Ceiling]) -> list[dict]:
    return [{"name": c.name, "value": c.value, "source": c.source} for c in found]


def _text(value: int | float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
