"""The configured rails of this process (``VPAY_RAILS_FILE``), loaded once."""

from __future__ import annotations

import threading

from charges.rails.config import RailConfig, RailConfigError, load_rails
from vpay.logging import register_secret

_lock = threading.Lock()
_rails: dict[str, RailConfig] | None = None


def configured_rails() -> dict[str, RailConfig]:
    """Every configured rail by code. Raises :class:`RailConfigError` when the configuration
    is unusable (the system check refuses to start on the same error first)."""
    global _rails
    with _lock:
        if _rails is None:
            from django.conf import settings

            _rails = load_rails(
                rails_file=settings.VPAY_RAILS_FILE,
                sandbox_url=settings.VPAY_SANDBOX_RAIL_URL,
                live_mode=settings.LIVE_MODE,
            )
            # A rail may echo its key in an answer; no pattern knows its shape, so the log
            # and excerpt redaction replaces it by value.
            for rail in _rails.values():
                register_secret(rail.api_key)
        return _rails


def get_rail(code: str) -> RailConfig | None:
    return configured_rails().get(code)


def forget_configured_rails() -> None:
    """Drop the loaded configuration; the next use reads the settings again (a process
    whose settings changed — a test overriding ``VPAY_RAILS_FILE`` — calls this)."""
    global _rails
    with _lock:
        _rails = None


__all__ = ["RailConfig", "RailConfigError", "configured_rails", "forget_configured_rails", "get_rail"]
