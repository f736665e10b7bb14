"""The signature scheme and the receiver-side verify(): pure, no database."""

from __future__ import annotations

import hashlib
import hmac
import random
import string
import time

import pytest

from webhooks.signing import (
    MAX_SIGNATURES,
    SignatureVerificationError,
    compute_signature,
    parse_header,
    signature_header,
    verify,
)

BODY = b'{"id":"evt_1"}'
T = 1_700_000_000


def stripe_style_verify_header(payload: str, header: str, secret: str, tolerance: int | None = None) -> bool:
    """A transcription of stripe-python's ``WebhookSignature.verify_header`` (MIT), the
    verifier merchants already run. vpay's header must pass it given the endpoint secret."""
    list_items = [i.split("=", 2) for i in header.split(",")]
    timestamp = int([i[1] for i in list_items if i[0] == "t"][0])  # noqa: RUF015 - as transcribed
    signatures = [i[1] for i in list_items if i[0] == "v1"]
    if not signatures:
        raise ValueError("No signatures found with expected scheme")
    signed_payload = "%d.%s" % (timestamp, payload)  # noqa: UP031 - as transcribed: t re-rendered by %d
    expected = hmac.new(secret.encode("utf-8"), msg=signed_payload.encode("utf-8"), digestmod=hashlib.sha256)
    if not any(hmac.compare_digest(expected.hexdigest(), s) for s in signatures):
        raise ValueError("No signatures found matching the expected signature for payload")
    if tolerance and timestamp < time.time() - tolerance:
        raise ValueError("Timestamp outside the tolerance zone")
    return True


def test_a_known_answer():
    # Computed independently: printf '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_test_secret
    assert compute_signature("1700000000", BODY, "whsec_test_secret") == (
        "248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a"
    )
    assert signature_header(BODY, ["whsec_test_secret"], T) == (
        "t=1700000000,v1=248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a"
    )


def test_one_v1_per_secret_in_configuration_order():
    header = signature_header(BODY, ["old", "new"], T)
    t_text, sigs = parse_header(header)
    assert t_text == str(T)
    assert sigs == [compute_signature(t_text, BODY, "old"), compute_signature(t_text, BODY, "new")]


@pytest.mark.parametrize("secrets", [["s1"], ["s1", "s2"], ["ünïcode-sécret", "s2", "s3"]])
def test_a_stripe_style_verifier_accepts_the_header_with_each_secret(secrets):
    header = signature_header(BODY, secrets, int(time.time()))
    for secret in secrets:
        assert stripe_style_verify_header(BODY.decode(), header, secret, tolerance=300)
        assert verify(BODY, header, secret) > 0
    with pytest.raises(ValueError):
        stripe_style_verify_header(BODY.decode(), header, "not-a-configured-secret")


def test_verify_accepts_any_one_matching_v1():
    header = signature_header(BODY, ["a", "b", "c"], T)
    for secret in ("a", "b", "c"):
        assert verify(BODY, header, [secret], now=T) == T
    assert verify(BODY, header, ["zzz", "b"], now=T) == T  # the receiver may hold several too
    assert verify(BODY.decode(), header, "c", now=T) == T  # str payloads are UTF-8 encoded


def test_verify_rejects_a_tampered_body():
    header = signature_header(BODY, ["s"], T)
    with pytest.raises(SignatureVerificationError, match="no signature matches"):
        verify(BODY + b" ", header, "s", now=T)
    with pytest.raises(SignatureVerificationError):
        verify(b'{"id":"evt_2"}', header, "s", now=T)


def test_verify_rejects_a_wrong_secret():
    header = signature_header(BODY, ["s"], T)
    with pytest.raises(SignatureVerificationError):
        verify(BODY, header, "S", now=T)
    with pytest.raises(SignatureVerificationError, match="no secret"):
        verify(BODY, header, [], now=T)
    with pytest.raises(SignatureVerificationError, match="no secret"):
        verify(BODY, header, "", now=T)


def test_the_hmac_covers_the_literal_t_text():
    # A re-rendered t ("01700000000" is the same integer) must not verify: t_text is signed as written.
    sig = compute_signature(str(T), BODY, "s")
    with pytest.raises(SignatureVerificationError):
        verify(BODY, f"t=0{T},v1={sig}", "s", now=T)
    assert verify(BODY, f"t={T},v1={sig}", "s", now=T) == T


@pytest.mark.parametrize(
    ("offset", "ok"), [(0, True), (300, True), (-300, True), (301, False), (-301, False), (86_400, False)]
)
def test_verify_tolerance_in_both_directions(offset, ok):
    header = signature_header(BODY, ["s"], T)
    if ok:
        assert verify(BODY, header, "s", now=T + offset) == T
    else:
        with pytest.raises(SignatureVerificationError, match="tolerance"):
            verify(BODY, header, "s", now=T + offset)


@pytest.mark.parametrize("tolerance", [0, -1, -300, 0.0, float("nan"), float("-inf"), float("inf"), True, None, "300"])
def test_verify_refuses_a_tolerance_that_would_switch_replay_protection_off(tolerance):
    # A plain ValueError, not SignatureVerificationError: a receiver catching the latter
    # must not treat its own misconfiguration as one bad request among many.
    header = signature_header(BODY, ["s"], T)
    with pytest.raises(ValueError, match="tolerance") as refused:
        verify(BODY, header, "s", tolerance=tolerance, now=T + 10**6)
    assert not isinstance(refused.value, SignatureVerificationError)
    with pytest.raises(ValueError, match="tolerance"):
        verify(BODY, header, "s", tolerance=tolerance, now=T)  # refused even when the age is fine


def test_verify_uses_the_hosts_clock_by_default():
    with pytest.raises(SignatureVerificationError, match="tolerance"):
        verify(BODY, signature_header(BODY, ["s"], T), "s")  # 2023 is long past
    assert verify(BODY, signature_header(BODY, ["s"], int(time.time())), "s")


GOOD = signature_header(BODY, ["s"], T)
SIG = GOOD.split("v1=")[1]


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        f"v1={SIG}",  # no t
        f"t={T}",  # no v1: what an endpoint without secrets would produce
        f"t={T},t={T},v1={SIG}",  # two t
        f"t=abc,v1={SIG}",
        f"t=-{T},v1={SIG}",  # pre-epoch clock
        "t=" + "\u0661\u0667" + "\u0660" * 8 + f",v1={SIG}",  # Arabic-Indic digits: isdigit() says yes
        f"t={T}.5,v1={SIG}",
        f"t=,v1={SIG}",
        f"t={T},v1=",
        f"t={T},v0={SIG}",  # another scheme only
        f"t={T},v1={SIG.upper()}",
        f"t={T},{SIG}",
        ",".join([f"t={T}"] + [f"v1={SIG}"] * (MAX_SIGNATURES + 1)),
        "t=" + "9" * 10_000 + f",v1={SIG}",
    ],
)
def test_verify_rejects_malformed_headers(header):
    with pytest.raises(SignatureVerificationError):
        verify(BODY, header, "s", now=T)


@pytest.mark.parametrize("header", [None, 12, b"t=1,v1=00", ["t=1"]])
def test_verify_rejects_non_string_headers_with_the_documented_error(header):
    with pytest.raises(SignatureVerificationError):
        verify(BODY, header, "s", now=T)  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", [None, 12, object()])
def test_verify_rejects_unusable_payloads_with_the_documented_error(payload):
    with pytest.raises(SignatureVerificationError):
        verify(payload, GOOD, "s", now=T)  # type: ignore[arg-type]


def test_fuzzed_headers_raise_only_the_documented_error():
    rng = random.Random(20261130)
    alphabet = string.printable + "=,t v1é\x00\u202e\u0661"
    pieces = ["t=", "v1=", ",", "=", str(T), SIG, SIG[:10], "v0=", " ", "t", "1"]
    accepted = 0
    for _ in range(5000):
        if rng.random() < 0.5:
            header = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        else:
            header = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        try:
            verify(BODY, header, "s", now=T)
        except SignatureVerificationError:
            continue
        accepted += 1
        # Whatever was accepted really carries the right signature for the literal t.
        t_text, sigs = parse_header(header)
        assert compute_signature(t_text, BODY, "s") in sigs
    assert accepted < 5000


def test_signing_needs_bytes():
    with pytest.raises(TypeError):
        signature_header("text", ["s"], T)  # type: ignore[arg-type]
