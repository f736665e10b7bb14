"""Webhook secrets at rest: sealed with the configured key, opened by any configured key."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet

from webhooks import sealing


def test_a_sealed_secret_opens_and_does_not_show(settings):
    secret = sealing.new_secret()
    assert secret.startswith("whsec_") and len(secret) > 40
    token = sealing.seal(secret)
    assert secret not in token
    assert sealing.open_sealed(token) == secret


def test_key_rotation_the_old_key_still_opens_and_reseal_moves_it(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.VPAY_SECRETS_KEYS = [old]
    token = sealing.seal("whsec_abc")
    settings.VPAY_SECRETS_KEYS = [new, old]
    assert sealing.open_sealed(token) == "whsec_abc"
    moved = sealing.reseal(token)
    settings.VPAY_SECRETS_KEYS = [new]
    assert sealing.open_sealed(moved) == "whsec_abc"
    with pytest.raises(sealing.SecretUnreadable) as info:
        sealing.open_sealed(token)
    assert "whsec" not in str(info.value)


def test_garbage_is_unreadable_not_a_crash(settings):
    for token in ["", "nonsense", "gAAAAA" + "x" * 80, "é"]:
        with pytest.raises(sealing.SecretUnreadable):
            sealing.open_sealed(token)


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
