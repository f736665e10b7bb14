"""What of a rail's answer may be kept: its body read (or found unreadable) and the excerpt
``provider_requests.response_excerpt`` stores, with every credential of the payer's order
removed. The adapter (``charges.rails.adapter``) classifies the answer; this reads it."""

from __future__ import annotations

import json
import re

from vpay.logging import redact, redact_value


def read(raw: bytearray, oversized: bool, max_bytes: int) -> tuple[object, str]:
    """The parsed body (``UNREADABLE`` when it is not JSON) and its excerpt.

    A body nested past the parser's recursion limit (it fits well within the size cap) is
    unreadable like any other: it must not escape as an error of ours."""
    if oversized:
        return UNREADABLE, f"[answer larger than {max_bytes} bytes]"
    text = raw.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
        return body, answer_excerpt(body, text)
    except (ValueError, RecursionError):
        return UNREADABLE, answer_excerpt(UNREADABLE, text)


UNREADABLE = object()  # a body that is not JSON (``None`` is JSON's null)
EXCERPT_CHARS = 500
# An answer's fields that let whoever holds them pay the payer's order. The URL need not
# spell its token as ``pay_token=`` (a path segment, ``?session=``), so no pattern over
# text can be trusted to find it: these go by name, whatever their value looks like.
_PAYABLE_FIELDS = frozenset({"pay_token", "redirect_url"})
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://\S+")
REDACTED = "[REDACTED]"


def answer_excerpt(body: object, text: str) -> str:
    """What ``provider_requests.response_excerpt`` may keep of an answer.

    Built from the parsed body, never from the raw text: ``pay_token`` and ``redirect_url``
    replaced by name, credential-named keys by :func:`vpay.logging.redact_value`, and any
    other string that holds a URL replaced too (a rail may nest its payable link under a
    name of its own). An answer that is not JSON (a proxy's HTML error page) keeps its
    text with every URL removed and credentials scrubbed.
    """
    if body is UNREADABLE:
        return storable(redact(_URL.sub(REDACTED, text)))[:EXCERPT_CHARS]
    return storable(json.dumps(_scrub(body), separators=(",", ":"), ensure_ascii=False))[:EXCERPT_CHARS]


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: a NUL and a lone surrogate (JSON's ``"\\ud800"``)
    written as escapes, not refused by the database on the statement recording the answer."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def unstorable(value: object) -> bool:
    return isinstance(value, str) and storable(value) != value


def _scrub(value: object) -> object:
    if isinstance(value, dict):
        return {k: REDACTED if k in _PAYABLE_FIELDS else _scrub(v) for k, v in redact_value(value).items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return REDACTED
    return value
