"""Log formatting and the secret-redaction filter.

Production logs are one JSON object a line; development logs are readable text. Both
carry the record's structured fields (``extra={...}``), among them ``alert=True`` where a
human must look. The redaction filter is the last line of defence: code never logs a
secret on purpose, and anything shaped like one is scrubbed anyway.

Redaction works twice over. First by exact value, for every secret this process knows
(the settings' secrets, read afresh on each call, and the rails' keys, registered when
they are loaded): a rail's key has no shape a pattern could know. Then by pattern, for
secrets it does not know (a merchant's key, a client secret, a bearer token).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

from django.core.signals import setting_changed

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

_SECRET_PATTERNS = [
    # API keys, webhook secrets, client secrets: sk_..., whsec_..., rk_..., cs_secret_...,
    # over the whole token_urlsafe alphabet (a key issued before keys were base62 has '-').
    (re.compile(r"\b(sk|rk|whsec|pk_live|sk_live|sk_test|cs_secret)_[A-Za-z0-9_-]{6,}"), r"\1_[REDACTED]"),
    # OAuth bearer tokens (at_live_…, at_test_…) and JWTs (a client assertion is a credential
    # until it expires): header.payload[.signature], each part base64url.
    (re.compile(r"\b(at_live|at_test)_[A-Za-z0-9_-]{6,}"), r"\1_[REDACTED]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}(\.[A-Za-z0-9_-]*)?"), "[REDACTED JWT]"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{6,}"), r"\1 [REDACTED]"),
    # user:password@ in URLs (DATABASE_URL, rail base URLs with credentials).
    (re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]+@"), r"\1:[REDACTED]@"),
    # key=value and "key": "value" where the key names a credential, prefixed or not
    # (client_secret, access_token, DB_PASSWORD), also as a quoted key in a dict's repr.
    (
        re.compile(r"(?i)\b(\w*(?:api[_-]?key|secret|password|passwd|token))(['\"]?\s*[=:]\s*['\"]?)[^\s'\",}]+"),
        r"\1\2[REDACTED]",
    ),
    # Authorization headers of any scheme (Bearer, Basic, Token ...).
    (re.compile(r"(?i)\b(authorization['\"]?\s*[=:]\s*['\"]?)(\w+\s+)?[^\s'\",}]+"), r"\1\2[REDACTED]"),
]


# Whether any of the patterns could match, in one pass: most strings redacted (a rail answer's
# ids, statuses and currencies) match none, and seven substitutions over each cost a worker
# settling charges 5 % of its time (bench/CHARGES.md). Each pattern is wrapped as a group with
# its own flags, so the alternation finds a match exactly where one of them would (a pattern
# with another flag, or a backreference, would need more than this: refused here).
assert all(
    p.flags & ~(re.IGNORECASE | re.UNICODE) == 0 and not re.search(r"\\[1-9]|\(\?P=", p.pattern)
    for p, _ in _SECRET_PATTERNS
), "_ANY_SECRET only carries IGNORECASE"
_ANY_SECRET = re.compile(
    "|".join(
        f"(?i:{pattern.pattern.removeprefix('(?i)')})" if pattern.flags & re.IGNORECASE else f"(?:{pattern.pattern})"
        for pattern, _ in _SECRET_PATTERNS
    )
)


# A known value shorter than this is left to the patterns: replacing it everywhere would
# blank ordinary words that contain it (a database password "vpay" in "vpay.worker").
MIN_EXACT_LENGTH = 8
REDACTED = "[REDACTED]"
_registered: set[str] = set()
_registered_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Redact ``value`` by its exact value from now on (a rail's key, once loaded)."""
    global _generation
    if isinstance(value, str) and len(value) >= MIN_EXACT_LENGTH:
        with _registered_lock:
            if value not in _registered:
                _registered.add(value)
                _generation += 1


def _settings_secrets() -> list[str]:
    """The secrets in the settings, read now (a test may have overridden them)."""
    from django.conf import settings

    if not settings.configured:
        return []
    found = [
        getattr(settings, "SECRET_KEY", ""),
        getattr(settings, "VPAY_METRICS_TOKEN", ""),
        *getattr(settings, "VPAY_SECRETS_KEYS", []),
        *(db.get("PASSWORD") or "" for db in getattr(settings, "DATABASES", {}).values()),
        getattr(settings, "VPAY_DATABASE_DIRECT", {}).get("PASSWORD") or "",
    ]
    alert_url = getattr(settings, "ALERT_WEBHOOK_URL", "")
    if alert_url:
        # The whole URL, and its path with query: an error may quote either (its token is
        # often a path segment, which no pattern recognises).
        parts = urlsplit(alert_url)
        found += [alert_url, parts.path + (f"?{parts.query}" if parts.query else ""), parts.password or ""]
    return found


# The known secrets' forms, built again only when what they are made from changed: a secret
# registered, or a setting changed (Django's setting_changed: override_settings, pytest-django's
# settings fixture), counted in _generation. Read from the settings on every call, they cost a
# worker settling charges 2 % of its time (a rail answer's excerpt redacts each of its strings;
# bench/CHARGES.md). Nothing is kept while the settings are not configured yet. A setting
# changed in place without the signal (a test's monkeypatch of a DATABASES entry) is not
# seen until something else changes: change settings through override_settings.
_generation = 0
_known: tuple[int, list[str]] = (-1, [])


def _settings_changed(**kwargs) -> None:
    global _generation
    with _registered_lock:
        _generation += 1


setting_changed.connect(_settings_changed, dispatch_uid="vpay.logging.known_secrets")


def _known_secrets() -> list[str]:
    """Every known secret as it may be written (raw, percent-encoded), longest first, so a
    secret that contains another is replaced whole."""
    global _known
    generation, forms = _known
    if generation == _generation:
        return forms
    with _registered_lock:
        generation, registered = _generation, frozenset(_registered)
    from django.conf import settings

    values = set(registered) | {v for v in _settings_secrets() if isinstance(v, str)}
    forms = sorted(
        {form for v in values if len(v) >= MIN_EXACT_LENGTH for form in (v, quote(v, safe=""))}, key=len, reverse=True
    )
    if settings.configured:
        _known = (generation, forms)
    return forms


def redact(text: str) -> str:
    """Scrub every known secret, and anything shaped like a credential, out of ``text``."""
    for secret in _known_secrets():
        if secret in text:
            text = text.replace(secret, REDACTED)
    if _ANY_SECRET.search(text) is None:
        return text
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# A key names a credential when its last word does (access_token, client_secret, DB_PASSWORD,
# apiKey, Authorization); a key that only mentions one (token_count) does not, and its value
# is judged by its shape like any other. A plural (oauth_access_tokens, cookies) may name
# credentials or count them: its strings and lists go, its numbers (a count) stay.
_SECRET_KEY = re.compile(r"(?i)(?:^|[^a-z0-9])(api[_-]?key|secret|password|passwd|token|authorization|cookie)(s?)$")


def _secret_key(key) -> str | None:
    """``"one"`` when ``key`` names a credential, ``"many"`` when it names several (a plural),
    else None (camelCase read as words)."""
    if not isinstance(key, str):
        return None
    found = _SECRET_KEY.search(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key))
    return None if found is None else ("many" if found.group(2) else "one")


def _under_secret_key(value, kind: str):
    # None and booleans say nothing about a secret, nor does a number under a plural (a
    # count); a string keeps what the patterns leave (whsec_[REDACTED]) when they recognise
    # it, and goes whole when they do not.
    if value is None or isinstance(value, bool) or (kind == "many" and isinstance(value, int | float)):
        return value
    if isinstance(value, str):
        scrubbed = redact(value)
        return scrubbed if scrubbed != value else REDACTED
    return REDACTED


def redact_value(value):
    """:func:`redact` through dicts, lists and tuples; a value under a credential-named key goes."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: redact_value(v) if (kind := _secret_key(k)) is None else _under_secret_key(v, kind)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact_value(v) for v in value)
    return value


class RedactSecretsFilter(logging.Filter):
    """Rewrites the message, the extras (strings, and strings inside dicts and lists) and the
    exception text of every record through :func:`redact`."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = redact(message)
        if scrubbed != message or record.args:
            record.msg, record.args = scrubbed, None
        for key, value in list(vars(record).items()):
            if key in _STANDARD_ATTRS:
                continue
            if (kind := _secret_key(key)) is not None:
                setattr(record, key, _under_secret_key(value, kind))
            elif isinstance(value, str | dict | list | tuple):
                setattr(record, key, redact_value(value))
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record written while a ``/v1`` request is served
    (``vpay.request_context``), so one request's lines can be found together. Lets every
    record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        from vpay.request_context import current_request_id  # Django's signals: not at configure time

        request_id = current_request_id()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


class CountAlertsFilter(logging.Filter):
    """Counts every record that carries ``alert=True`` in ``vpay_alert_log_lines_total``
    (by logger and level), so that a Prometheus rule sees each line a human must look at,
    whichever code wrote it. Lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "alert", False) is True:
            from vpay import metrics  # prometheus_client, not needed to configure logging

            metrics.ALERT_LOG_LINES.labels(logger=record.name, level=record.levelname).inc()
        return True


def _extras(record: logging.LogRecord) -> dict:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, then the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Readable development lines: ``time level logger message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line += f"  {fields}"
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line += "\n" + record.exc_text
        return line
