"""Django's technical 500 page (VPAY_DEBUG, never live mode) hides vpay's secrets.

Rendered for real through ``technical_500_response``: the settings table, the request's
META (``runserver`` copies the environment into it) and the traceback's local variables.
"""

from __future__ import annotations

import sys

import pytest
from django.test import RequestFactory
from django.views.debug import get_default_exception_reporter_filter, technical_500_response

DB_PASSWORD = "S3cretPw-Xy9_zq"
ALERT_TOKEN = "tOk-4b7Q9zX2mLp"
RAIL_KEY = "momo-Key-9f8e7d6c5b4a"
URL_PASSWORD = "railpw-7Hq2Lm"
FRAME_PASSWORD = "framepw-3Kd8Vn"
SECRETS = [DB_PASSWORD, ALERT_TOKEN, RAIL_KEY, URL_PASSWORD, FRAME_PASSWORD]


@pytest.fixture
def page(settings):
    database_url = f"postgresql://vpay:{DB_PASSWORD}@db.internal:5432/vpay"
    alert_url = f"https://hooks.example.com/services/T0/B0/{ALERT_TOKEN}"
    settings.DATABASE_URL = database_url
    settings.ALERT_WEBHOOK_URL = alert_url
    # A URL with credentials under a name that says nothing of secrets.
    settings.VPAY_SANDBOX_RAIL_URL = f"https://ops:{URL_PASSWORD}@rail.example.com"
    request = RequestFactory().get(
        "/v1/payment_intents",
        DATABASE_URL=database_url,
        ALERT_WEBHOOK_URL=alert_url,
        VPAY_RAILS_JSON=f'{{"momo": {{"api_key": "{RAIL_KEY}"}}}}',
    )

    def failing_view():
        dsn = f"postgresql://app:{FRAME_PASSWORD}@replica/vpay"  # noqa: F841 - shown on the page
        rail = {"code": "momo", "api_key": RAIL_KEY}  # noqa: F841
        raise RuntimeError("the view failed")

    try:
        failing_view()
    except RuntimeError:
        return technical_500_response(request, *sys.exc_info()).content.decode()


def test_the_default_exception_reporter_filter_is_vpays():
    assert type(get_default_exception_reporter_filter()).__name__ == "SecretsExceptionReporterFilter"


def test_the_debug_page_shows_no_database_url_alert_url_rail_key_or_url_password(page):
    # The page did render the settings, the request and the frames the secrets were in.
    for shown in ("DATABASE_URL", "ALERT_WEBHOOK_URL", "VPAY_SANDBOX_RAIL_URL", "rail.example.com", "dsn", "replica"):
        assert shown in page, shown
    for secret in SECRETS:
        assert secret not in page, secret
