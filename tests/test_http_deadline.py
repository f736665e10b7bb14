"""vpay.http_deadline: the one total deadline both outbound HTTP clients (rail calls and
webhook delivery) put on every socket operation. The rail's side is shown against a
dripping server in tests/test_rails.py; webhook delivery's here, with the pure budget."""

from __future__ import annotations

import ipaddress
import time

import httpcore
import pytest

from tests.test_rails import _Misbehaving
from vpay.http_deadline import remaining
from webhooks.services.transport import post


def test_no_deadline_leaves_the_timeout_as_it_is():
    assert remaining(None, 3.0, httpcore.ReadTimeout, "x") == 3.0
    assert remaining(None, None, httpcore.ReadTimeout, "x") is None


def test_the_timeout_is_cut_to_what_is_left_of_the_deadline():
    deadline = time.monotonic() + 1.0
    assert 0 < remaining(deadline, 30.0, httpcore.ReadTimeout, "x") <= 1.0
    assert 0 < remaining(deadline, None, httpcore.ReadTimeout, "x") <= 1.0
    assert remaining(deadline, 0.25, httpcore.ReadTimeout, "x") == 0.25


def test_a_deadline_that_has_passed_raises_the_operations_own_timeout():
    past = time.monotonic() - 0.001
    with pytest.raises(httpcore.WriteTimeout, match=r"^the call's total timeout elapsed$"):
        remaining(past, 5.0, httpcore.WriteTimeout, "the call")


def test_a_receiver_dripping_its_headers_cannot_hold_a_webhook_attempt_past_the_total_timeout():
    # 200 header bytes, one every 20 ms: each read is far inside the per-read timeout and the
    # whole answer would take about 4 s. The attempt's total is 0.5 s.
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Pad: " + b"a" * 150 + b"\r\n"
    answer += b"Content-Length: 2\r\n\r\nok"
    server = _Misbehaving([answer[i : i + 1] for i in range(len(answer))], gap=0.02)
    loopback = [ipaddress.ip_address("127.0.0.1")]
    try:
        got = post(
            f"http://127.0.0.1:{server.port}/hooks",
            b"{}",
            {},
            addresses=loopback,
            connect_timeout=0.5,
            total_timeout=0.5,
        )
        assert got.status_code is None and "Timeout" in type(got.error).__name__
        # It hung up mid-headers, rather than sitting them out.
        assert server.answered.wait(10) and server.served == ["cut"]
        assert server.sent < len(answer) - 2
    finally:
        server.close()
    fast = _Misbehaving([answer], gap=0)
    try:
        got = post(
            f"http://127.0.0.1:{fast.port}/hooks", b"{}", {}, addresses=loopback, connect_timeout=0.5, total_timeout=0.5
        )
        assert got.status_code == 200 and got.excerpt == "ok"
    finally:
        fast.close()
