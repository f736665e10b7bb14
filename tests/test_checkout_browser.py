"""The hosted checkout page in a real browser (Debian's Chromium under Selenium, the
``browser`` fixture) against a live server, the sandbox rail and a real worker: a payer pays
on a push rail and on a redirect rail and lands on the merchant's success page; the page on a
phone-sized window in dark mode. Screenshots go to ``test-artifacts/checkout/``."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from tests.browser_fixtures import navigate_by, shot, text_of
from tests.charges_support import events, intent_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class _Thanks(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<!doctype html><title>Thanks</title><h1 id='thanks'>Thanks for your order</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def merchant_site():
    """The merchant's own site, where success_url points: a real HTTP server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Thanks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def open_session(payment_stack, merchant_site: str, rail: str, amount: int) -> dict:
    response = payment_stack.acme.call(
        "POST",
        "/v1/checkout/sessions",
        {
            "amount": amount,
            "currency": "eur",
            "rail": rail,
            "success_url": merchant_site + "/thanks/{CHECKOUT_SESSION_ID}",
            "cancel_url": merchant_site + "/cart",
        },
    )
    assert response.status_code == 200, response.content
    return response.json()


def wait_until_at(browser, prefix: str, timeout: float = 30) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(lambda b: b.current_url.startswith(prefix))


def assert_completed(session: dict) -> None:
    from charges.models import CheckoutSession

    done = CheckoutSession.objects.get(pk=session["id"])
    assert (done.status, done.payment_status) == ("complete", "paid")
    assert intent_status(session["payment_intent"]) == "succeeded"
    assert [t for t, _ in events(session["id"], "checkout.session.completed")] == ["checkout.session.completed"]


def test_a_payer_pays_on_a_push_rail_and_lands_on_the_merchants_page(
    browser, live_server, payment_stack, merchant_site
):
    from selenium.webdriver.common.by import By

    payment_stack.worker()
    session = open_session(payment_stack, merchant_site, "sandbox_push", 2500)
    browser.set_window_size(1280, 1000)
    browser.get(live_server.url + urlsplit(session["url"]).path)
    assert browser.find_element(By.ID, "merchant").text == "Acme"
    assert browser.find_element(By.ID, "amount").text == "€25.00"
    assert session["client_secret"] not in browser.page_source
    shot(browser, "01-push-pay", "checkout")
    navigate_by(browser, browser.find_element(By.ID, "pay"))
    assert "Payment in progress" in text_of(browser) or browser.current_url.startswith(merchant_site)
    shot(browser, "02-push-following", "checkout")
    wait_until_at(browser, f"{merchant_site}/thanks/{session['id']}")
    assert browser.find_element(By.ID, "thanks").text == "Thanks for your order"
    assert_completed(session)


def test_a_payer_is_sent_to_a_redirect_rail_and_back_to_the_merchant_once_paid(
    browser, live_server, payment_stack, merchant_site
):
    from selenium.webdriver.common.by import By

    payment_stack.worker()
    session = open_session(payment_stack, merchant_site, "sandbox_redirect", 1999)
    page = live_server.url + urlsplit(session["url"]).path
    browser.get(page)
    navigate_by(browser, browser.find_element(By.ID, "pay"))
    # On the rail's own page (the sandbox's pay link approves the payment when opened).
    wait_until_at(browser, payment_stack.rail.url + "/redirect/pay/")
    shot(browser, "03-redirect-rail", "checkout")
    # The rail sends the payer back; the page follows the payment to the merchant's page.
    browser.get(page)
    wait_until_at(browser, f"{merchant_site}/thanks/{session['id']}")
    assert_completed(session)


def test_the_page_reads_on_a_phone_in_dark_mode(browser, live_server, acme_api, merchant_site):
    from selenium.webdriver.common.by import By

    response = acme_api.call(
        "POST",
        "/v1/checkout/sessions",
        {"amount": 125000, "currency": "eur", "rail": "sandbox_push", "cancel_url": merchant_site + "/cart"},
    )
    session = response.json()
    browser.set_window_size(390, 844)
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    try:
        browser.get(live_server.url + urlsplit(session["url"]).path)
        button = browser.find_element(By.ID, "pay")
        assert button.text == "Pay €1,250.00"
        # Dark, and the whole card fits the phone's width (no sideways scrolling).
        background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(17, 20, 23)"
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
        assert button.size["width"] > 250
        shot(browser, "04-phone-dark", "checkout")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        browser.set_window_size(1280, 1000)
