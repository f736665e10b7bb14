"""``/metrics`` on the web process: the decision table, the URLconf through Django's test
client, and a real gunicorn in live mode over HTTP."""

from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vpay.metrics_access import Access, metrics_access

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "mEtr1cs-T0ken-9f8e7d6c"
FERNET_KEY = "uK3mJ1tq0J0Xx9m1Yv7yqk0pP2o2b5m8y4r6t8w0z2c="
INSIDE, OUTSIDE = "10.1.2.3", "192.0.2.1"
NETS = (ipaddress.ip_network("10.0.0.0/8"),)

AUTHORIZATIONS = ["", f"Bearer {TOKEN}", f"bearer {TOKEN}", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"]
ADDRESSES = [INSIDE, OUTSIDE, "", "::ffff:10.1.2.3", "not-an-address"]


@pytest.mark.parametrize(
    ("live_mode", "token", "cidrs", "authorization", "remote_addr"),
    list(itertools.product([False, True], ["", TOKEN], [(), NETS], AUTHORIZATIONS, ADDRESSES)),
)
def test_the_metrics_access_table(live_mode, token, cidrs, authorization, remote_addr):
    right_token = bool(token) and authorization.lower() == f"bearer {TOKEN}".lower()
    inside = bool(cidrs) and remote_addr == INSIDE  # an IPv4-mapped IPv6 address is not 10/8
    if not token and not cidrs:
        expected = Access.NOT_FOUND if live_mode else Access.ALLOW
    elif right_token or inside:
        expected = Access.ALLOW
    else:
        expected = Access.UNAUTHORIZED if token else Access.FORBIDDEN
    got = metrics_access(
        live_mode=live_mode, token=token, cidrs=cidrs, authorization=authorization, remote_addr=remote_addr
    )
    assert got is expected


# --- the URLconf, through Django's test client ------------------------------------------------


@pytest.mark.django_db  # a served scrape reads the breaker gauges
def test_metrics_are_open_in_development_when_nothing_is_configured(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and b"django_http_requests" in response.content


def test_live_mode_hides_metrics_until_someone_is_allowed(client, settings):
    settings.LIVE_MODE = True
    response = client.get("/metrics")
    assert response.status_code == 404 and b"django_http" not in response.content


@pytest.mark.django_db  # a served scrape reads the breaker gauges
def test_live_mode_serves_metrics_to_the_bearer_of_the_token_only(client, settings, caplog):
    settings.LIVE_MODE = True
    settings.VPAY_METRICS_TOKEN = TOKEN
    with caplog.at_level(logging.DEBUG):
        missing = client.get("/metrics")
        wrong = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN[:-1]}"})
        right = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"django_http" not in missing.content + wrong.content and b"django_http" in right.content
    assert TOKEN[:-1] not in caplog.text


@pytest.mark.django_db  # a served scrape reads the breaker gauges
def test_live_mode_serves_metrics_to_an_allowed_network_by_its_peer_address_only(client, settings):
    settings.LIVE_MODE = True
    settings.VPAY_METRICS_ALLOW_CIDRS = NETS
    assert client.get("/metrics", REMOTE_ADDR=INSIDE).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR=OUTSIDE).status_code == 403
    # A forwarded header is the client's own claim.
    assert client.get("/metrics", REMOTE_ADDR=OUTSIDE, headers={"X-Forwarded-For": INSIDE}).status_code == 403


# --- settings and a real web process ------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "DJANGO_SECRET_KEY": "x" * 50, **extra}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setting", "value"), [("VPAY_METRICS_ALLOW_CIDRS", "10.0.0.0/8,nonsense"), ("VPAY_METRICS_TOKEN", "short-tok")]
)
def test_a_bad_metrics_setting_refuses_to_start_naming_the_setting(setting, value):
    from tests.conftest import database_url

    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=_env(DATABASE_URL=database_url(), **{setting: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and setting in result.stderr, result.stderr[-2000:]
    assert "short-tok" not in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, **headers: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.django_db
@pytest.mark.parametrize("token", ["", TOKEN], ids=["nothing configured", "a token configured"])
def test_a_live_gunicorn_answers_metrics_only_as_configured(tmp_path, token):
    from tests.conftest import database_url

    rails = tmp_path / "rails.json"
    rails.write_text(json.dumps({"momo": {"base_url": "https://rail.example", "flow": "push", "api_key": "k" * 20}}))
    port = _free_port()
    env = _env(
        DATABASE_URL=database_url(),
        VPAY_LIVE_MODE="true",
        VPAY_SECRETS_KEY=FERNET_KEY,
        VPAY_RAILS_FILE=str(rails),
        VPAY_SECURE_SSL_REDIRECT="false",
        VPAY_METRICS_TOKEN=token,
        VPAY_PUBLIC_URL="https://pay.example.com",
        VPAY_CHECKOUT_BASE_URL="https://pay.example.com/checkout/",
    )
    gunicorn = Path(sys.executable).with_name("gunicorn")
    log = (tmp_path / "gunicorn.log").open("wb")
    proc = subprocess.Popen(
        [str(gunicorn), "vpay.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(url)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "gunicorn.log").read_text()
                time.sleep(0.1)
        if not token:
            assert status == 404 and b"django_http" not in body
        else:
            assert status == 401 and b"django_http" not in body
            status, body = _get(url, Authorization=f"Bearer {TOKEN}")
            assert status == 200 and b"django_http_requests" in body
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
    assert TOKEN not in (tmp_path / "gunicorn.log").read_text()
