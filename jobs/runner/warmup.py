"""What a worker process builds once at boot so that its first job does not.

A TLS context costs 20-30 ms to build (it loads the CA bundle), and each process built its
own at its first webhook delivery and its first request to each rail: at idle those first
deliveries were the p99 of commit -> receipt, 50-60 ms against a p50 of 12 ms
(bench/WEBHOOKS.md). Apps register what to build (``register_warm_up``, in their
``ready()``); ``Worker.boot`` builds it before the first claim. A failure costs nothing but
the warm-up: it is logged, and the first use builds it as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_WARM_UPS: dict[str, Callable[[], object]] = {}


def register_warm_up(name: str, build: Callable[[], object]) -> None:
    """Build ``build()`` at each worker's boot (``name`` says what, in a failure's log line)."""
    _WARM_UPS[name] = build


def warm_up() -> None:
    for name, build in list(_WARM_UPS.items()):
        try:
            build()
        except Exception:
            logger.warning("could not build %s at boot; its first use will", name, exc_info=True)
