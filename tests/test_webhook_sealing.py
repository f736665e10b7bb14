"""Webhook secrets at rest: sealed with the configured key for their endpoint, opened by any
configured key for that endpoint only."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from webhooks import sealing


def test_a_sealed_secret_opens_and_does_not_show(settings):
    secret = sealing.new_secret()
    assert secret.startswith("whsec_") and len(secret) > 40
    token = sealing.seal(secret, "we_a")
    assert secret not in token
    assert sealing.open_sealed(token, "we_a") == secret


def test_a_secret_sealed_for_one_endpoint_does_not_open_for_another(settings):
    token = sealing.seal("whsec_abc", "we_a")
    for opener in (sealing.open_sealed, sealing.open_sealed_cached):
        assert opener(token, "we_a") == "whsec_abc"  # the cached one remembers it for we_a only
        with pytest.raises(sealing.SecretUnreadable) as info:
            opener(token, "we_b")
        assert "whsec" not in str(info.value)
    with pytest.raises(sealing.SecretUnreadable):
        sealing.reseal(token, "we_b")


def test_a_secret_sealed_before_binding_still_opens_until_that_format_is_turned_off(settings):
    legacy = Fernet(settings.VPAY_SECRETS_KEYS[0]).encrypt(b"whsec_old").decode()
    assert sealing.open_sealed(legacy, "we_a") == "whsec_old"
    moved = sealing.reseal(legacy, "we_a")
    assert moved.startswith("v2.")
    settings.VPAY_SEALED_READ_FERNET = False
    with pytest.raises(sealing.SecretUnreadable):
        sealing.open_sealed(legacy, "we_a")
    assert sealing.open_sealed(moved, "we_a") == "whsec_old"


def test_key_rotation_the_old_key_still_opens_and_reseal_moves_it(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.VPAY_SECRETS_KEYS = [old]
    token = sealing.seal("whsec_abc", "we_a")
    settings.VPAY_SECRETS_KEYS = [new, old]
    assert sealing.open_sealed(token, "we_a") == "whsec_abc"
    moved = sealing.reseal(token, "we_a")
    settings.VPAY_SECRETS_KEYS = [new]
    assert sealing.open_sealed(moved, "we_a") == "whsec_abc"
    with pytest.raises(sealing.SecretUnreadable) as info:
        sealing.open_sealed(token, "we_a")
    assert "whsec" not in str(info.value)


def test_garbage_is_unreadable_not_a_crash(settings):
    for token in ["", "nonsense", "gAAAAA" + "x" * 80, "é", "v2.", "v2.!!", "v2." + "A" * 40, "v2.é"]:
        with pytest.raises(sealing.SecretUnreadable):
            sealing.open_sealed(token, "we_a")


def test_parse_keys():
    key = Fernet.generate_key().decode()
    assert sealing.parse_keys(f" {key} ,") == [key]
    assert sealing.parse_keys("") == []
    with pytest.raises(ValueError, match="key #2") as info:
        sealing.parse_keys(f"{key},not-a-key-but-maybe-a-secret")
    assert "not-a-key" not in str(info.value)


def test_the_dev_key_is_derived_and_stable():
    a = sealing.derive_dev_key("one")
    assert a == sealing.derive_dev_key("one") != sealing.derive_dev_key("two")
    Fernet(a)  # a usable key


def test_a_secret_in_a_log_line_is_scrubbed_whole():
    from vpay.logging import redact

    for _ in range(50):
        secret = sealing.new_secret()
        assert secret[6:] not in redact(f"endpoint secret={secret} and bare {secret}")
        assert len(secret) == 49 and secret[6:].isalnum()
