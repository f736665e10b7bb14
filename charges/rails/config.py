"""Rails are configuration, not code.

``VPAY_RAILS_FILE`` names a JSON file::

    {"momo": {"base_url": "https://rail.example/v1", "flow": "push", "api_key": "..."}}

Unset, development gets the sandbox rail's two rails (``sandbox_push`` and
``sandbox_redirect`` on ``VPAY_SANDBOX_RAIL_URL``); live mode has no default. A rail with
an unknown flow, no key, or (in live mode) a non-https URL is refused by a system check
that ``runworker`` and ``runserver`` run before they start, with a message naming the rail.

Credentials stay out of every repr and log line: :class:`RailConfig`'s repr shows whether
a key is set, never the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from charges.states import RailFlow

_CODE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_KNOWN_FIELDS = {"base_url", "flow", "api_key"}
SANDBOX_API_KEY = "sandbox-rail-key"


class RailConfigError(ValueError):
    """The rails configuration is unusable; the message names the rail."""


@dataclass(frozen=True)
class RailConfig:
    code: str
    base_url: str
    flow: RailFlow
    api_key: str = field(repr=False)

    def __repr__(self) -> str:
        key = "set" if self.api_key else "missing"
        return f"RailConfig(code={self.code!r}, base_url={self.base_url!r}, flow={self.flow.value!r}, api_key=<{key}>)"

    __str__ = __repr__


def sandbox_rails(base: str) -> dict:
    """The development default: the sandbox rail process serves one rail per flow."""
    base = base.rstrip("/")
    return {
        "sandbox_push": {"base_url": f"{base}/push", "flow": "push", "api_key": SANDBOX_API_KEY},
        "sandbox_redirect": {"base_url": f"{base}/redirect", "flow": "redirect", "api_key": SANDBOX_API_KEY},
    }


def parse_rails(raw: object, *, live_mode: bool) -> dict[str, RailConfig]:
    """Validate a decoded rails document; raises :class:`RailConfigError` naming the rail."""
    if not isinstance(raw, dict) or not raw:
        raise RailConfigError("the rails configuration must be a non-empty JSON object of rail code -> settings")
    rails: dict[str, RailConfig] = {}
    for code, spec in raw.items():
        if not isinstance(code, str) or not _CODE.match(code):
            raise RailConfigError(f"rail {code!r}: the code must be lower-case letters, digits and _ (max 32)")
        if not isinstance(spec, dict):
            raise RailConfigError(f"rail {code!r}: its settings must be a JSON object")
        unknown = set(spec) - _KNOWN_FIELDS
        if unknown:
            raise RailConfigError(f"rail {code!r}: unknown field(s) {', '.join(sorted(unknown))}")
        flow = spec.get("flow")
        if flow not in RailFlow.values:
            raise RailConfigError(
                f"rail {code!r}: unknown flow {flow!r} (expected one of {', '.join(RailFlow.values)})"
            )
        api_key = spec.get("api_key")
        if not isinstance(api_key, str) or not api_key.strip():
            raise RailConfigError(f"rail {code!r}: api_key is missing")
        base_url = spec.get("base_url")
        if not isinstance(base_url, str) or not base_url:
            raise RailConfigError(f"rail {code!r}: base_url is missing")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RailConfigError(f"rail {code!r}: base_url must be an http(s) URL")
        if parts.username or parts.password:
            raise RailConfigError(f"rail {code!r}: base_url must not carry credentials (use api_key)")
        if live_mode and parts.scheme != "https":
            raise RailConfigError(f"rail {code!r}: base_url must be https in live mode")
        rails[code] = RailConfig(code, base_url.rstrip("/"), RailFlow(flow), api_key.strip())
    return rails


def load_rails(*, rails_file: str, sandbox_url: str, live_mode: bool) -> dict[str, RailConfig]:
    """The configured rails: the file when named, else (development only) the sandbox's."""
    if rails_file:
        try:
            raw = json.loads(Path(rails_file).read_text())
        except OSError as exc:
            raise RailConfigError(f"VPAY_RAILS_FILE {rails_file!r} cannot be read: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            # The message of a JSON error quotes position, never content.
            raise RailConfigError(f"VPAY_RAILS_FILE {rails_file!r} is not valid JSON: {exc.msg}") from None
        except ValueError:
            # Undecodable bytes (UnicodeDecodeError): this clause used to read .msg, which only
            # a JSON error has, and so raised AttributeError instead of the refusal.
            raise RailConfigError(f"VPAY_RAILS_FILE {rails_file!r} cannot be decoded as text") from None
        return parse_rails(raw, live_mode=live_mode)
    if live_mode:
        raise RailConfigError("VPAY_RAILS_FILE must be set in live mode (the sandbox rails are development-only)")
    return parse_rails(sandbox_rails(sandbox_url), live_mode=False)
