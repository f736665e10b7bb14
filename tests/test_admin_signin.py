"""Signing in to the operator console: failed logins lock out the account and the address
(django-axes), and live mode admits staff only with a TOTP token (django-otp). Real test
client against the real admin login page; the dev path keeps a password alone."""

from __future__ import annotations

import base64
import io
import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "pw-ops-123"  # the test operator's password


@pytest.fixture
def ops():
    return User.objects.create_superuser("ops", "ops@example.com", PASSWORD)


def _login(address: str, username: str, password: str, **otp) -> tuple[Client, int]:
    client = Client(REMOTE_ADDR=address)
    response = client.post(LOGIN, {"username": username, "password": password, **otp})
    return client, response.status_code


def test_failed_logins_lock_the_account_out_from_every_address(ops, settings):
    settings.AXES_FAILURE_LIMIT = 3
    for n in range(2):
        assert _login(f"198.51.100.{n}", "ops", "wrong")[1] == 200  # the form again, with its error
    assert _login("198.51.100.2", "ops", "wrong")[1] == 429  # the limit: locked out
    # Now even the right password, from an address that never failed, is refused.
    client, status = _login("203.0.113.9", "ops", PASSWORD)
    assert status == 429
    assert client.get("/admin/").status_code == 302  # not signed in


def test_failed_logins_lock_the_address_out_for_every_account(ops, settings):
    settings.AXES_FAILURE_LIMIT = 3
    User.objects.create_superuser("ops2", "ops2@example.com", PASSWORD)
    for name in ("alice", "bob"):  # one failure each: no account reaches the limit
        assert _login("198.51.100.7", name, "guess")[1] == 200
    assert _login("198.51.100.7", "carol", "guess")[1] == 429  # but the address does
    assert _login("198.51.100.7", "ops2", PASSWORD)[1] == 429
    client, status = _login("203.0.113.10", "ops2", PASSWORD)  # another address: fine
    assert status == 302 and client.get("/admin/").status_code == 200


def test_dev_mode_signs_in_with_a_password_alone(ops, settings):
    settings.LIVE_MODE = False
    client, status = _login("127.0.0.1", "ops", PASSWORD)
    assert status == 302 and client.get("/admin/").status_code == 200


def test_live_mode_staff_without_a_verified_device_cannot_reach_the_index(ops, settings):
    settings.LIVE_MODE = True
    client, status = _login("127.0.0.1", "ops", PASSWORD)
    assert status == 200  # the login page again: a token is required
    assert client.get("/admin/").status_code == 302
    # A password session alone (however it was made) is not enough either.
    client = Client()
    client.force_login(ops)
    index = client.get("/admin/")
    assert index.status_code == 302 and index["Location"].startswith("/admin/login/")
    assert client.get("/admin/overview/").status_code == 302
    assert client.get("/admin/jobs/deadletter/").status_code == 302


def test_live_mode_staff_with_a_totp_token_reaches_the_index(ops, settings):
    settings.LIVE_MODE = True
    out = io.StringIO()
    call_command("totp", "add", "ops", stdout=out)
    url = re.search(r"otpauth://\S+", out.getvalue()).group(0)
    key = base64.b32decode(parse_qs(urlsplit(url).query)["secret"][0])
    device = TOTPDevice.objects.get(user=ops)
    assert device.bin_key == key and device.confirmed
    wrong = f"{(totp(key) + 1) % 1_000_000:06d}"
    assert _login("127.0.0.1", "ops", PASSWORD, otp_device=device.persistent_id, otp_token=wrong)[1] == 200
    device.refresh_from_db()
    device.throttle_reset()  # django-otp delays the next try after a wrong token
    client, status = _login("127.0.0.1", "ops", PASSWORD, otp_device=device.persistent_id, otp_token=f"{totp(key):06d}")
    assert status == 302
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/overview/").status_code == 200


def test_the_totp_command_lists_and_removes_devices(ops):
    call_command("totp", "add", "ops", "--name", "phone", stdout=io.StringIO())
    call_command("totp", "add", "ops", "--name", "laptop", "--replace", stdout=io.StringIO())
    listed = io.StringIO()
    call_command("totp", "list", stdout=listed)
    assert listed.getvalue().split("\n")[0].split("\t") == ["ops", "laptop", "confirmed"]
    assert "secret" not in listed.getvalue()
    call_command("totp", "remove", "ops", stdout=io.StringIO())
    assert not TOTPDevice.objects.filter(user=ops).exists()
