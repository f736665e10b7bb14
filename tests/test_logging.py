"""vpay.logging's redaction (messages, extras, exception text) and vpay.errors.error_chain."""

from __future__ import annotations

import io
import json
import logging
import string
import sys

import pytest
from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st

from vpay.errors import error_chain
from vpay.logging import JsonFormatter, RedactSecretsFilter, TextFormatter, redact, register_secret

SECRETS = {
    "stripe key": ("charging with sk_live_51HxAbCdEf0123456789", "sk_live_51HxAbCdEf0123456789"),
    "test key": ("key sk_test_abcdef123456 in use", "sk_test_abcdef123456"),
    "restricted key": ("rk_live_abcdef123456", "rk_live_abcdef123456"),
    "webhook secret": ("verifying with whsec_9f8e7d6c5b4a3", "whsec_9f8e7d6c5b4a3"),
    "bearer token": ("Authorization: Bearer eyJhbGciOi.JIUzI1Ni-J9_x", "eyJhbGciOi.JIUzI1Ni-J9_x"),
    "lowercase bearer": ("header bearer abc123def456", "abc123def456"),
    "url password": ("connecting to postgresql://vpay:s3cr3tPass@db:5432/vpay", "s3cr3tPass"),
    "url password, no user": ("redis://:hunter2hunter2@cache:6379/0", "hunter2hunter2"),
    "password=": ("login failed password=hunter22 for ops", "hunter22"),
    "api_key:": ('{"api_key": "AKIA1234567890"}', "AKIA1234567890"),
    "token=": ("retry with token=abc.def.ghi", "abc.def.ghi"),
    "dict repr": ("{'api_key': 'AKIA1234567890'}", "AKIA1234567890"),
    "basic auth header": ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
}


@pytest.mark.parametrize(("text", "secret"), list(SECRETS.values()), ids=list(SECRETS))
def test_redact__scrubs_each_shape_of_secret(text, secret):
    scrubbed = redact(text)
    assert secret not in scrubbed
    assert "[REDACTED]" in scrubbed


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("client_secret=c1i3ntS3cr3tValue", "c1i3ntS3cr3tValue"),
        ("access_token=ya29.a0AfH6SMBx", "ya29.a0AfH6SMBx"),
        ("DB_PASSWORD=hunter22", "hunter22"),
        ("checkout cs_secret_abcdef123456", "cs_secret_abcdef123456"),
    ],
    ids=["client_secret=", "access_token=", "DB_PASSWORD=", "cs_secret_"],
)
def test_redact__scrubs_secrets_whose_key_has_a_prefix(text, secret):
    # The key=value rule is about keys named secret/password/token/api_key; a prefixed name
    # (client_secret, access_token) is the same secret. cs_secret_ is named in the module.
    assert secret not in redact(text)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("key sk_test_Ab3-x9_Qz-7kLmNoPq in use", "sk_test_Ab3-x9_Qz-7kLmNoPq"),
        ("key sk_live_-leading-dash-and-more", "sk_live_-leading-dash-and-more"),
        ("paying with cs_secret_Zy-1_xW-2vUtSrQp", "cs_secret_Zy-1_xW-2vUtSrQp"),
        ("signed with whsec_abc-def-ghi-jkl", "whsec_abc-def-ghi-jkl"),
    ],
    ids=["api key", "api key starting with -", "client secret", "webhook secret"],
)
def test_a_token_with_dashes_is_redacted_whole_not_up_to_its_first_dash(text, secret):
    # token_urlsafe's alphabet has '-': a pattern stopping there left the key's tail.
    scrubbed = redact(text)
    for piece in secret.split("-"):
        if len(piece) >= 4:
            assert piece not in scrubbed, scrubbed
    assert "[REDACTED]" in scrubbed


def test_a_registered_secret_is_redacted_by_its_exact_value_whatever_its_shape():
    # A rail's key has no shape a pattern could know.
    register_secret("momo-Key-9f8e7d6c5b4a")
    assert redact("POST refused: no account has the key momo-Key-9f8e7d6c5b4a") == (
        "POST refused: no account has the key [REDACTED]"
    )


def test_the_alert_urls_exact_value_and_its_path_are_redacted(settings):
    settings.ALERT_WEBHOOK_URL = "https://hooks.example.com/services/T0AB/B0CD/xYz-9q8W7e6R5t"
    scrubbed = redact(
        "alert POST to https://hooks.example.com/services/T0AB/B0CD/xYz-9q8W7e6R5t failed;"
        " retrying /services/T0AB/B0CD/xYz-9q8W7e6R5t"
    )
    assert "xYz-9q8W7e6R5t" not in scrubbed and "[REDACTED]" in scrubbed


def test_the_database_password_is_redacted_by_value_raw_and_percent_encoded(settings):
    redact("warm the known secrets' cache")  # a setting changed after it is read still counts
    with pytest.warns(UserWarning, match="DATABASES"):  # Django's, for any override of DATABASES
        settings.DATABASES = {
            **settings.DATABASES,
            "default": {**settings.DATABASES["default"], "PASSWORD": "pa-ss@word/42x"},
        }
    scrubbed = redact('connection to "db" failed for pa-ss@word/42x (dsn postgresql://vpay:pa-ss%40word%2F42x@db/v)')
    assert "pa-ss" not in scrubbed and "42x" not in scrubbed


def test_a_secret_registered_after_a_redaction_is_redacted_from_then_on():
    assert redact("key rk_9f8e7d6c-registered-later") == "key rk_[REDACTED]"  # the shape alone
    assert "Zq81!registered" in redact("value Zq81!registered")
    register_secret("Zq81!registered")
    assert redact("value Zq81!registered") == "value [REDACTED]"


@given(
    st.lists(
        st.one_of(
            st.text(alphabet=string.ascii_letters + string.digits + "_-.:/@=' \"{},", max_size=12),
            st.sampled_from(
                [
                    "sk_",
                    "whsec_",
                    "at_live_",
                    "eyJ",
                    "Bearer ",
                    "bearer\t",
                    "://",
                    ":",
                    "@",
                    "api_key",
                    "API-KEY",
                    "secret",
                    "Password",
                    "token",
                    "=",
                    ": ",
                    "'",
                    '"',
                    "authorization",
                    "Authorization: Basic ",
                ]
            ),
        ),
        max_size=12,
    ).map("".join)
)
def test_the_one_pass_check_finds_a_match_exactly_where_one_of_the_patterns_would(text):
    """redact() skips the substitutions where _ANY_SECRET finds nothing: it must never miss
    what a pattern would have found (nor find what none would, which only costs time)."""
    from vpay.logging import _ANY_SECRET, _SECRET_PATTERNS

    assert (_ANY_SECRET.search(text) is not None) == any(p.search(text) for p, _ in _SECRET_PATTERNS)


def test_a_short_registered_value_is_not_redacted_everywhere():
    # A four-letter password would otherwise blank every word that contains it ("vpay").
    register_secret("vpay")
    assert redact("vpay.worker started") == "vpay.worker started"


@pytest.mark.django_db
def test_new_api_keys_and_checkout_client_secrets_are_letters_and_digits_redacted_whole():
    from charges.services.intents import create_session
    from merchants.services import api_key_issue, create_merchant

    merchant, _ = create_merchant("Acme")
    letters_and_digits = set(string.ascii_letters + string.digits)
    for _ in range(20):
        key = api_key_issue(merchant=merchant)
        secret = create_session(merchant, {"amount": 1000, "currency": "usd", "rail": "sandbox_push"}).client_secret
        assert set(key.removeprefix("sk_test_")) <= letters_and_digits, key
        assert set(secret.removeprefix("cs_secret_")) <= letters_and_digits, secret
        assert redact(f"key {key} and {secret} end") == "key sk_[REDACTED] and cs_secret_[REDACTED] end"
    # As strong as before: 256 bits for a key (43 of 62), 192 for a client secret (33 of 62).
    assert (len(key), len(secret)) == (len("sk_test_") + 43, len("cs_secret_") + 33)


@pytest.mark.parametrize(
    "text",
    [
        "job 8d7f finished in 12 ms",
        "task_abcdefgh is not a key",
        "see https://example.com/path@v2",
        "postgresql://vpay@db/vpay",
        "bearer",
    ],
)
def test_redact__leaves_ordinary_text_alone(text):
    assert redact(text) == text


# --- the filter and the formatters on a real logger ------------------------------------------


@pytest.fixture
def json_log():
    """A logger whose handler has the redaction filter and the JSON formatter, as settings wire it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactSecretsFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False

    def lines() -> list[dict]:
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    yield logger, lines, stream
    logger.removeHandler(handler)


def test_the_filter_scrubs_the_formatted_message(json_log):
    logger, lines, stream = json_log
    logger.info("calling %s with %s", "https://user:pw12345@api.example.com/x", "sk_live_abcdef123456")
    (entry,) = lines()
    assert entry["message"] == "calling https://user:[REDACTED]@api.example.com/x with sk_[REDACTED]"
    assert "pw12345" not in stream.getvalue()


def test_the_filter_scrubs_string_extras_and_keeps_other_fields(json_log):
    logger, lines, stream = json_log
    logger.warning(
        "webhook rejected",
        extra={"signature_secret": "whsec_abcdef123456", "auth": "Bearer abcdef.123456", "alert": True, "n": 3},
    )
    (entry,) = lines()
    assert entry["signature_secret"] == "whsec_[REDACTED]"
    assert entry["auth"] == "Bearer [REDACTED]"
    assert (entry["alert"], entry["n"], entry["level"], entry["logger"]) == (True, 3, "warning", "tests.redaction")
    assert "abcdef123456" not in stream.getvalue()


def test_counts_under_keys_that_merely_mention_tokens_are_kept(json_log):
    # The sweep's line: a count per table, one table named oauth_access_tokens.
    logger, lines, _ = json_log
    counts = {"oauth_access_tokens": 3, "idempotency_keys": 5, "token_count": 2, "secrets_rotated": 1}
    logger.info("sweep_expired", extra={"counts": counts, "tokens_issued": 7})
    (entry,) = lines()
    assert entry["counts"] == counts
    assert entry["tokens_issued"] == 7


@pytest.mark.parametrize(
    "key",
    ["access_token", "refresh-token", "client_secret", "DB_PASSWORD", "passwd", "api_key", "apiKey", "Authorization",
     "Cookie", "secret", "token"],
)  # fmt: skip
def test_a_value_under_a_secret_shaped_key_is_redacted_whatever_its_shape(json_log, key):
    logger, lines, stream = json_log
    logger.info("request", extra={"headers": {key: "plainvalue42", "n": 1}, key: "plainvalue42"})
    (entry,) = lines()
    assert entry["headers"] == {key: "[REDACTED]", "n": 1}
    assert entry[key] == "[REDACTED]"
    assert "plainvalue42" not in stream.getvalue()


def test_strings_under_a_plural_secret_key_are_redacted_and_its_counts_kept(json_log):
    logger, lines, stream = json_log
    logger.info("issued", extra={"detail": {"tokens": ["plainvalue42"], "cookies": "plainvalue43", "secrets": 2}})
    (entry,) = lines()
    assert entry["detail"] == {"tokens": "[REDACTED]", "cookies": "[REDACTED]", "secrets": 2}
    assert "plainvalue4" not in stream.getvalue()


def test_a_secret_shaped_value_is_redacted_under_any_key(json_log):
    logger, lines, _ = json_log
    logger.info("called", extra={"detail": {"note": "used sk_live_abcdef123456", "count": 4}})
    (entry,) = lines()
    assert entry["detail"] == {"note": "used sk_[REDACTED]", "count": 4}


def test_the_filter_scrubs_exception_text(json_log):
    logger, lines, stream = json_log
    try:
        raise ConnectionError("could not connect to postgresql://vpay:TopS3cret@db/vpay")
    except ConnectionError:
        logger.exception("database down")
    (entry,) = lines()
    assert "ConnectionError" in entry["exception"]
    assert "postgresql://vpay:[REDACTED]@db/vpay" in entry["exception"]
    assert "TopS3cret" not in stream.getvalue()


def test_the_json_formatter_alone_still_scrubs_exception_text():
    record = _record_with_exception(ValueError("bad key sk_test_0123456789abc"))
    entry = json.loads(JsonFormatter().format(record))
    assert "sk_test_0123456789abc" not in entry["exception"]
    assert "sk_[REDACTED]" in entry["exception"]


def test_the_text_formatter_scrubs_exception_text_through_the_filter():
    record = _record_with_exception(ValueError("Bearer abcdefghijkl"))
    RedactSecretsFilter().filter(record)
    line = TextFormatter().format(record)
    assert "abcdefghijkl" not in line
    assert "Bearer [REDACTED]" in line


def test_settings_put_the_redaction_filter_on_the_console_handler():
    assert settings.LOGGING["handlers"]["console"]["filters"] == ["request_id", "count_alerts", "redact"]
    assert settings.LOGGING["filters"]["redact"]["()"] == "vpay.logging.RedactSecretsFilter"
    assert settings.LOGGING["filters"]["count_alerts"]["()"] == "vpay.logging.CountAlertsFilter"


@pytest.mark.parametrize(
    ("extra", "counted"), [({"alert": True}, 1), ({"alert": False}, 0), ({}, 0), ({"alert": "yes"}, 0)]
)
def test_the_alert_filter_counts_each_record_that_carries_alert_true(extra, counted):
    from prometheus_client import REGISTRY

    from vpay.logging import CountAlertsFilter

    labels = {"logger": "tests.count_alerts", "level": "ERROR"}
    before = REGISTRY.get_sample_value("vpay_alert_log_lines_total", labels) or 0
    record = logging.LogRecord("tests.count_alerts", logging.ERROR, __file__, 1, "something", None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    assert CountAlertsFilter().filter(record) is True  # never drops a line
    assert (REGISTRY.get_sample_value("vpay_alert_log_lines_total", labels) or 0) - before == counted


def _record_with_exception(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except type(exc):
        return logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())


# --- error_chain -------------------------------------------------------------------------------


def test_error_chain__lists_the_exception_then_its_causes_and_contexts():
    try:
        try:
            try:
                raise OSError("connection refused")
            except OSError as exc:
                raise TimeoutError("connect timed out") from exc
        except TimeoutError:
            raise RuntimeError("sync failed")  # implicit context  # noqa: B904
    except RuntimeError as exc:
        chain = error_chain(exc)
    assert chain == "RuntimeError: sync failed <- TimeoutError: connect timed out <- OSError: connection refused"


def test_error_chain__of_an_exception_without_a_message_is_its_type():
    assert error_chain(ValueError()) == "ValueError"


def test_error_chain__is_bounded_to_its_limit():
    exc = ValueError("x" * 5000)
    chain = error_chain(exc, limit=100)
    assert len(chain) == 100
    assert chain.startswith("ValueError: xxx")
    assert chain.endswith("…")
    assert len(error_chain(exc)) == 2000


def test_error_chain__stops_on_a_cycle():
    first, second = ValueError("a"), KeyError("b")
    first.__cause__, second.__cause__ = second, first
    assert error_chain(first) == "ValueError: a <- KeyError: 'b'"


def test_error_chain__scrubs_secrets_from_every_link():
    try:
        try:
            raise ConnectionError("postgresql://vpay:hunter2hunter2@db/vpay unreachable")
        except ConnectionError as exc:
            raise RuntimeError("charging with sk_live_abcdef123456 failed") from exc
    except RuntimeError as exc:
        chain = error_chain(exc)
    assert "hunter2hunter2" not in chain
    assert "sk_live_abcdef123456" not in chain
    assert chain.count("[REDACTED]") == 2
