"""Rails configuration and the httpx adapter, against the real sandbox rail over HTTP."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading

import pytest

from charges.rails.adapter import (
    HttpRailAdapter,
    RailConfigurationError,
    RailRejected,
    RailUnavailable,
)
from charges.rails.config import RailConfig, RailConfigError, load_rails, parse_rails, sandbox_rails
from charges.states import RailFlow, RailStatus
from tests.rail_support import ROOT, free_port
from vpay.errors import Category, Retry, classify

GOOD = {"momo": {"base_url": "https://rail.example/v1", "flow": "push", "api_key": "rk_live_abcdef123456"}}


# --- configuration --------------------------------------------------------------------


def test_a_good_rails_document_parses():
    rails = parse_rails(GOOD, live_mode=True)
    assert rails["momo"].flow is RailFlow.PUSH
    assert rails["momo"].base_url == "https://rail.example/v1"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"base_url": "https://r.example", "flow": "pull", "api_key": "k"}, "rail 'momo': unknown flow 'pull'"),
        ({"base_url": "https://r.example", "flow": "push"}, "rail 'momo': api_key is missing"),
        ({"base_url": "https://r.example", "flow": "push", "api_key": "  "}, "rail 'momo': api_key is missing"),
        ({"flow": "push", "api_key": "k"}, "rail 'momo': base_url is missing"),
        (
            {"base_url": "ftp://r.example", "flow": "push", "api_key": "k"},
            "rail 'momo': base_url must be an http(s) URL",
        ),
        ({"base_url": "https://u:p@r.example", "flow": "push", "api_key": "k"}, "must not carry credentials"),
        ({"base_url": "https://r.example", "flow": "push", "api_key": "k", "x": 1}, "unknown field(s) x"),
        ("nope", "rail 'momo': its settings must be a JSON object"),
    ],
)
def test_a_bad_rail_is_refused_with_a_message_naming_it(spec, message):
    with pytest.raises(RailConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rails({"momo": spec}, live_mode=False)


def test_live_mode_refuses_a_plain_http_rail_and_development_accepts_it():
    spec = {"momo": {"base_url": "http://rail.example", "flow": "push", "api_key": "k"}}
    with pytest.raises(RailConfigError, match="rail 'momo': base_url must be https in live mode"):
        parse_rails(spec, live_mode=True)
    assert parse_rails(spec, live_mode=False)["momo"].base_url == "http://rail.example"


def test_the_sandbox_rails_are_the_development_default_and_never_live():
    rails = load_rails(rails_file="", sandbox_url="http://127.0.0.1:8701", live_mode=False)
    assert {c: r.flow for c, r in rails.items()} == {
        "sandbox_push": RailFlow.PUSH,
        "sandbox_redirect": RailFlow.REDIRECT,
    }
    with pytest.raises(RailConfigError, match="VPAY_RAILS_FILE must be set in live mode"):
        load_rails(rails_file="", sandbox_url="http://127.0.0.1:8701", live_mode=True)


def test_a_rails_file_is_read(tmp_path):
    path = tmp_path / "rails.json"
    path.write_text(json.dumps(GOOD))
    assert set(load_rails(rails_file=str(path), sandbox_url="", live_mode=True)) == {"momo"}
    path.write_text("{not json")
    with pytest.raises(RailConfigError, match="is not valid JSON"):
        load_rails(rails_file=str(path), sandbox_url="", live_mode=True)
    # Bytes that are not text: refused by name too (this clause once raised AttributeError).
    path.write_bytes(b'{"momo": "\xff"}')
    with pytest.raises(RailConfigError, match="cannot be decoded as text"):
        load_rails(rails_file=str(path), sandbox_url="", live_mode=True)


def test_a_rails_key_never_reaches_a_repr_or_a_log_line(caplog):
    rail = parse_rails(GOOD, live_mode=True)["momo"]
    adapter = HttpRailAdapter(rail, connect_timeout=1, total_timeout=1)
    for text in (repr(rail), str(rail), repr(adapter), repr(parse_rails(GOOD, live_mode=True))):
        assert "rk_live_abcdef123456" not in text
        assert "api_key=<set>" in text
    with caplog.at_level(logging.INFO):
        logging.getLogger("test").info("rail %s", rail)
    assert "rk_live_abcdef123456" not in caplog.text


def _manage_check(tmp_path, rails: dict, *, live: bool) -> subprocess.CompletedProcess:
    path = tmp_path / "rails.json"
    path.write_text(json.dumps(rails))
    from tests.conftest import database_url

    env = {
        "PATH": "/usr/bin:/bin",
        "DATABASE_URL": database_url(),
        "VPAY_RAILS_FILE": str(path),
        "VPAY_LIVE_MODE": "1" if live else "0",
        "DJANGO_SECRET_KEY": "x" * 50,
        # Live mode also requires the key that seals webhook secrets (webhooks/sealing.py).
        "VPAY_SECRETS_KEY": "uK3mJ1tq0J0Xx9m1Yv7yqk0pP2o2b5m8y4r6t8w0z2c=",
        # And addresses payers and clients can reach (vpay/settings.py).
        "VPAY_PUBLIC_URL": "https://pay.example.com",
        "VPAY_CHECKOUT_BASE_URL": "https://pay.example.com/checkout/",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "runworker", "--burst"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.django_db
def test_runworker_refuses_to_start_on_a_bad_rail_naming_it(tmp_path):
    bad = {"momo": {"base_url": "http://rail.example", "flow": "push", "api_key": "rk_live_abcdef123456"}}
    result = _manage_check(tmp_path, bad, live=True)
    assert result.returncode != 0
    assert "rail 'momo': base_url must be https in live mode" in result.stderr
    assert "rk_live_abcdef123456" not in result.stderr + result.stdout


# --- the adapter, over HTTP to the sandbox --------------------------------------------


def adapter(rail_proc, code="sandbox_push", *, total=2.0, api_key=None) -> HttpRailAdapter:
    spec = rail_proc.rails()[code]
    rail = RailConfig(code, spec["base_url"], RailFlow(spec["flow"]), api_key or spec["api_key"])
    return HttpRailAdapter(rail, connect_timeout=0.5, total_timeout=total)


def test_push_submit_then_poll_to_success(sandbox_rail):
    a = adapter(sandbox_rail)
    answer = a.submit(reference="ch_push1", amount=1000, currency="usd")
    assert (answer.status, answer.http_status, answer.pay_token) == (RailStatus.PENDING, 200, None)
    assert a.status(reference="ch_push1", pay_token=None).status is RailStatus.SUCCEEDED
    sent = sandbox_rail.requests("ch_push1")
    assert sent[0]["method"] == "POST" and sent[0]["idempotency_key"] == "ch_push1"
    assert sent[0]["body"] == {"reference": "ch_push1", "amount": 1000, "currency": "usd"}


def test_redirect_submit_hands_out_a_url_and_polling_needs_the_pay_token(sandbox_rail):
    a = adapter(sandbox_rail, "sandbox_redirect")
    answer = a.submit(reference="ch_red1", amount=1000, currency="usd")
    assert answer.pay_token and answer.redirect_url and answer.pay_token in answer.redirect_url
    assert answer.pay_token not in repr(answer)
    assert a.status(reference="ch_red1", pay_token=None).status is RailStatus.NOT_FOUND
    assert a.status(reference="ch_red1", pay_token=answer.pay_token).status is RailStatus.SUCCEEDED


def test_failure_after_n_polls_carries_the_failure_code(sandbox_rail):
    sandbox_rail.scenario(amount=2001, outcome="failed", failure_code="insufficient_funds", after_polls=2)
    a = adapter(sandbox_rail)
    a.submit(reference="ch_f", amount=2001, currency="usd")
    assert a.status(reference="ch_f", pay_token=None).status is RailStatus.PENDING
    answer = a.status(reference="ch_f", pay_token=None)
    assert (answer.status, answer.failure_code) == (RailStatus.FAILED, "insufficient_funds")


def test_unknown_reference_is_not_found(sandbox_rail):
    assert adapter(sandbox_rail).status(reference="ch_nobody", pay_token=None).status is RailStatus.NOT_FOUND


def test_5xx_is_transient(sandbox_rail):
    sandbox_rail.scenario(amount=2002, error_submits=1, error_polls=1)
    a = adapter(sandbox_rail)
    with pytest.raises(RailUnavailable) as caught:
        a.submit(reference="ch_5", amount=2002, currency="usd")
    assert caught.value.http_status == 503
    assert classify(caught.value).category is Category.TRANSIENT and classify(caught.value).retry is Retry.BACKOFF
    a.submit(reference="ch_5", amount=2002, currency="usd")
    with pytest.raises(RailUnavailable):
        a.status(reference="ch_5", pay_token=None)
    assert a.status(reference="ch_5", pay_token=None).status is RailStatus.SUCCEEDED


def test_a_dropped_answer_is_transient_with_no_status_and_the_rail_kept_the_charge(sandbox_rail):
    sandbox_rail.scenario(amount=2003, drop_submits=1)
    a = adapter(sandbox_rail)
    with pytest.raises(RailUnavailable) as caught:
        a.submit(reference="ch_drop", amount=2003, currency="usd")
    assert caught.value.http_status is None
    assert a.status(reference="ch_drop", pay_token=None).status is RailStatus.SUCCEEDED


def test_a_slow_rail_times_out_as_transient(sandbox_rail):
    sandbox_rail.scenario(amount=2004, submit_delay=1.5)
    with pytest.raises(RailUnavailable, match="timed out"):
        adapter(sandbox_rail, total=0.3).submit(reference="ch_slow", amount=2004, currency="usd")


def test_refused_credentials_are_a_configuration_error(sandbox_rail):
    a = adapter(sandbox_rail, api_key="wrong-key")
    with pytest.raises(RailConfigurationError) as caught:
        a.status(reference="ch_x", pay_token=None)
    assert caught.value.http_status == 401
    c = classify(caught.value)
    assert (c.category, c.retry, c.alert) == (Category.CONFIGURATION, Retry.DEAD_LETTER, True)
    assert "wrong-key" not in str(caught.value)


def test_other_4xx_is_permanent(sandbox_rail):
    sandbox_rail.scenario(amount=2005, submit_status=422)
    with pytest.raises(RailRejected) as caught:
        adapter(sandbox_rail).submit(reference="ch_422", amount=2005, currency="usd")
    assert caught.value.http_status == 422
    assert classify(caught.value).category is Category.PERMANENT


@pytest.mark.parametrize("body", ["", "not json", "[]", "null", '{"status": "weird"}', '{"reference": "x"}'])
def test_a_2xx_the_adapter_cannot_read_is_transient_never_a_refusal(sandbox_rail, body):
    # The rail took the charge (it polls as succeeded): failing it on an unreadable
    # answer would tell the merchant "failed" while the payer's money moves.
    sandbox_rail.scenario(reference="ch_unread", submit_body=body)
    a = adapter(sandbox_rail)
    with pytest.raises(RailUnavailable, match="unreadable answer") as caught:
        a.submit(reference="ch_unread", amount=1000, currency="usd")
    assert caught.value.http_status == 200
    assert classify(caught.value).category is Category.TRANSIENT
    assert a.status(reference="ch_unread", pay_token=None).status is RailStatus.SUCCEEDED


@pytest.mark.parametrize("status", [408, 409, 425, 429, 302])
def test_statuses_that_refuse_nothing_for_good_are_transient(sandbox_rail, status):
    sandbox_rail.scenario(
        reference="ch_busy", submit_status=status, submit_records=True, error_polls=1, error_status=status
    )
    a = adapter(sandbox_rail)
    with pytest.raises(RailUnavailable) as caught:
        a.submit(reference="ch_busy", amount=1000, currency="usd")
    assert caught.value.http_status == status
    with pytest.raises(RailUnavailable):
        a.status(reference="ch_busy", pay_token=None)
    assert a.status(reference="ch_busy", pay_token=None).status is RailStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("7", 7.0), ("0", 0.0), (" 12 ", 12.0), ("-3", None), ("soon", None), ("99999999", 3600.0), (None, None)],
)
def test_retry_after_in_seconds_is_read_and_bounded(sandbox_rail, header, seconds):
    fields = {"error_polls": 1, "error_status": 429}
    if header is not None:
        fields["retry_after"] = header
    sandbox_rail.scenario(reference="ch_429", **fields)
    a = adapter(sandbox_rail)
    a.submit(reference="ch_429", amount=1000, currency="usd")
    with pytest.raises(RailUnavailable) as caught:
        a.status(reference="ch_429", pay_token=None)
    assert caught.value.http_status == 429 and caught.value.retry_after == seconds


def test_retry_after_as_a_date_is_measured_against_the_rails_own_date_header():
    # No clock of ours is read: the rail's Date and its Retry-After are both the rail's.
    from charges.rails.adapter import retry_after_seconds

    date = "Tue, 01 Dec 2026 18:00:00 GMT"
    assert retry_after_seconds("Tue, 01 Dec 2026 18:00:30 GMT", date) == 30.0
    assert retry_after_seconds("Tue, 01 Dec 2026 17:59:00 GMT", date) == 0.0
    assert retry_after_seconds("Tue, 01 Dec 2026 18:00:30 GMT", None) is None
    assert retry_after_seconds("Tue, 01 Dec 2026 18:00:30 GMT", "garbage") is None


def test_nothing_listening_is_transient():
    rail = RailConfig("gone", f"http://127.0.0.1:{free_port()}", RailFlow.PUSH, "k")
    with pytest.raises(RailUnavailable):
        HttpRailAdapter(rail, connect_timeout=0.3, total_timeout=0.5).status(reference="x", pay_token=None)


def test_sandbox_rails_helper_matches_the_process_layout():
    assert sandbox_rails("http://h:1/")["sandbox_push"]["base_url"] == "http://h:1/push"


# --- the hard deadline, against a local server that misbehaves on purpose ----------------


class _Misbehaving:
    """A raw TCP server on a thread: reads a request, then sends ``chunks`` of its answer
    ``gap`` seconds apart (a status line and headers dripped a byte at a time, say)."""

    def __init__(self, chunks: list[bytes], gap: float) -> None:
        self.chunks, self.gap = chunks, gap
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.served: list[str] = []  # per connection: "complete", or "cut" (the client hung up)
        self.sent = 0  # bytes of the answer sent on the last connection
        self.requests: list[bytes] = []  # what each connection sent first
        self.answered = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                self.requests.append(conn.recv(65536))
                self.sent = 0
                try:
                    for chunk in self.chunks:
                        if self.stop.wait(self.gap):
                            return
                        conn.sendall(chunk)
                        self.sent += len(chunk)
                    self.served.append("complete")
                except OSError:
                    self.served.append("cut")  # the client gave up and closed: what the deadline does
                self.answered.set()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def test_a_rail_dripping_its_headers_cannot_hold_a_call_past_the_total_timeout():
    # 200 header bytes, one every 20 ms: each read is far inside httpx's per-read timeout,
    # and the whole answer would complete after about 4 s. The total is 0.5 s.
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 150 + b"\r\n"
    body = b'{"status": "pending"}'
    answer += b"Content-Length: %d\r\n\r\n" % len(body)
    headers = len(answer)
    answer += body
    server = _Misbehaving([answer[i : i + 1] for i in range(len(answer))], gap=0.02)
    try:
        rail = RailConfig("drip", f"http://127.0.0.1:{server.port}", RailFlow.PUSH, "k")
        a = HttpRailAdapter(rail, connect_timeout=0.5, total_timeout=0.5)
        with pytest.raises(RailUnavailable, match="timed out"):
            a.status(reference="ch_drip", pay_token=None)
        # The caller hung up while the rail was still dripping its headers: it did not sit
        # them out and notice the time only once the body came (which a per-read timeout,
        # restarted by every byte, would have done).
        assert server.answered.wait(10) and server.served == ["cut"]
        assert server.sent < headers
        # The same server answering at once is an answer: the deadline, not the server, ended it.
        fast = _Misbehaving([answer], gap=0)
        try:
            rail = RailConfig("fast", f"http://127.0.0.1:{fast.port}", RailFlow.PUSH, "k")
            got = HttpRailAdapter(rail, connect_timeout=0.5, total_timeout=0.5).status(reference="x", pay_token=None)
            assert got.status is RailStatus.PENDING
        finally:
            fast.close()
    finally:
        server.close()


def test_a_rail_call_goes_through_a_proxy_from_the_environment_and_carries_no_cookie(monkeypatch):
    # The adapter sends straight to the client's transport for the URL (not through its
    # send): an environment proxy's transport must still be the one used, and a cookie the
    # rail sets must not come back with the next call.
    body = b'{"status": "succeeded"}'
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: session=s1; Path=/\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    proxy = _Misbehaving([answer], gap=0)
    try:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        rail = RailConfig("proxied", "http://rail.invalid", RailFlow.PUSH, "k")  # resolvable by no one
        adapter = HttpRailAdapter(rail, connect_timeout=0.5, total_timeout=2)
        for _ in range(2):
            assert adapter.status(reference="ch_1", pay_token=None).status is RailStatus.SUCCEEDED
        assert len(proxy.requests) == 2
        assert all(r.startswith(b"GET http://rail.invalid/") for r in proxy.requests)  # the proxy's form
        assert b"\r\ncookie:" not in proxy.requests[1].lower()
    finally:
        proxy.close()


def test_an_answer_that_is_not_json_is_recorded_without_its_urls():
    page = b"<html>502 from the proxy; retry at https://psp.example/pay/abcDEF123 token=zz9</html>"
    answer = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: %d\r\n\r\n" % len(page) + page
    server = _Misbehaving([answer], gap=0)
    try:
        rail = RailConfig("proxy", f"http://127.0.0.1:{server.port}", RailFlow.PUSH, "k")
        with pytest.raises(RailUnavailable) as caught:
            HttpRailAdapter(rail, connect_timeout=0.5, total_timeout=2).status(reference="x", pay_token=None)
        excerpt = caught.value.body_excerpt
        assert "502 from the proxy" in excerpt
        assert "abcDEF123" not in excerpt and "zz9" not in excerpt and "://" not in excerpt
    finally:
        server.close()
