"""Test-only: SIGKILL this process at a named point of ``vpay.faultpoints``.

Loaded into a ``runworker`` subprocess by the ``sitecustomize`` a rehearsal puts on its
``PYTHONPATH`` (``tests/killpoints_support.py``), never by shipping code. It reads

    VPAY_TEST_KILL_AT=<point>[@<subject>][:<nth>]

and kills the process, with SIGKILL and nothing flushed but one line on stderr, the
``nth`` time (1 by default) the point is reached with that subject (any subject when
none is given): ``job.claimed@poll_charge:3`` is the third poll job about to run.

It refuses to load at all in live mode (``VPAY_LIVE_MODE``, read as the settings read
it), and the callback checks the settings again before it kills.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import environ

from vpay import faultpoints

ENV = "VPAY_TEST_KILL_AT"


class FaultInjectionRefused(RuntimeError):
    """The fault-injection module was loaded where it must never run."""


def parse(spec: str) -> tuple[str, str | None, int]:
    """``point[@subject][:nth]`` → (point, subject or None, nth); ValueError if malformed."""
    head, _, nth_text = spec.partition(":")
    point, _, subject = head.partition("@")
    if point not in faultpoints.POINTS:
        raise ValueError(f"{ENV}: unknown point {point!r}; known: {', '.join(sorted(faultpoints.POINTS))}")
    nth = int(nth_text) if nth_text else 1
    if nth < 1:
        raise ValueError(f"{ENV}: nth must be at least 1, not {nth}")
    return point, subject or None, nth


def live_mode() -> bool:
    return environ.Env().bool("VPAY_LIVE_MODE", default=False)


def killer(point: str, subject: str | None, nth: int):
    """The callback: counts the matching reaches and kills the process at the ``nth``."""
    lock = threading.Lock()
    seen = 0

    def reached(name: str, at_subject: str) -> None:
        nonlocal seen
        if name != point or (subject is not None and at_subject != subject):
            return
        with lock:
            seen += 1
            if seen != nth:
                return
        from django.conf import settings

        if settings.LIVE_MODE:  # a second look, at the moment it matters
            raise FaultInjectionRefused("fault injection refuses to act in live mode")
        sys.stderr.write(f"fault injection: SIGKILL at {name}@{at_subject} (#{nth})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    return reached


if live_mode():
    raise FaultInjectionRefused("tests/fault_injection.py must never be loaded in live mode (VPAY_LIVE_MODE is true)")
if os.environ.get(ENV):
    faultpoints.install(killer(*parse(os.environ[ENV])))
