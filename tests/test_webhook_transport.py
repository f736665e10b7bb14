"""The pinned, bounded POST against a real receiver process (no database)."""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest

from sandbox.receiver import fingerprint
from tests.webhook_support import free_port
from webhooks.services.transport import EXCERPT_BYTES, post
from webhooks.signing import signature_header
from webhooks.ssrf import AddressRefused, parse_cidrs, vet

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]
BODY = b'{"id":"evt_t1","object":"event","type":"test.ping"}'


def send(url, *, addresses=LOOPBACK, total=5.0, headers=None):
    return post(url, BODY, headers or {}, addresses=addresses, connect_timeout=2.0, total_timeout=total)


def test_a_host_whose_second_resolution_differs_is_still_connected_to_the_vetted_address(receiver):
    # A rebinding DNS server: the first answer is the (allow-listed) receiver, every later
    # answer a private address. The guard resolves once and the connection is pinned.
    answers = iter(["127.0.0.1", "10.66.66.66", "10.66.66.66"])
    calls = []

    def rebinding(host, port):
        calls.append(host)
        return [next(answers)]

    host = "rebind.invalid"  # not resolvable by the system: a re-resolution could not connect at all
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(host, receiver.port)
    addresses = vet(host, receiver.port, allow=parse_cidrs("127.0.0.1/32"), resolver=rebinding)
    answer = send(f"http://{host}:{receiver.port}/hooks/pinned", addresses=addresses)
    assert answer.status_code == 200, answer.error
    assert answer.connected_to == ("127.0.0.1", receiver.port)
    assert calls == [host]  # resolved exactly once
    [got] = receiver.received("/hooks/pinned")
    assert got["event_id"] == "evt_t1"
    # Had the second answer been used, the guard would have refused it:
    with pytest.raises(AddressRefused):
        vet(host, receiver.port, allow=parse_cidrs("127.0.0.1/32"), resolver=rebinding)


def test_the_signed_body_verifies_at_the_receiver(receiver):
    receiver.add_secrets("whsec_one", "whsec_two")
    header = signature_header(BODY, ["whsec_one", "whsec_two"], int(time.time()))
    answer = send(receiver.url("/hooks/signed"), headers={"Vpay-Signature": header, "Vpay-Delivery-Attempt": "1"})
    assert answer.status_code == 200
    [got] = receiver.received("/hooks/signed")
    assert got["verified"] and sorted(got["verified_by"]) == sorted(
        [fingerprint("whsec_one"), fingerprint("whsec_two")]
    )
    assert got["attempt"] == "1"


def test_an_endless_body_is_read_only_up_to_the_excerpt(receiver):
    answer = send(receiver.url("/hooks/endless?mode=endless"), total=30.0)
    assert answer.status_code == 200
    # Stopped by the bound, not by the deadline: no error, and exactly the excerpt kept.
    assert answer.error is None
    assert len(answer.excerpt) == EXCERPT_BYTES


def test_a_dropped_connection_is_no_response(receiver):
    answer = send(receiver.url("/hooks/drop?mode=drop"))
    assert answer.status_code is None
    assert answer.error is not None
    assert len(receiver.received("/hooks/drop")) == 1


def test_the_total_timeout_bounds_a_receiver_that_never_answers(receiver):
    answer = send(receiver.url("/hooks/hang?mode=hang&delay=30"), total=1.0)
    assert answer.status_code is None
    assert "Timeout" in type(answer.error).__name__


def test_a_redirect_is_an_answer_not_followed(receiver):
    answer = send(receiver.url("/hooks/moved?mode=redirect"))
    assert answer.status_code == 302
    assert [r["path"] for r in receiver.received()] == ["/hooks/moved"]  # /elsewhere never requested


def test_a_5xx_is_heard_with_its_excerpt(receiver):
    answer = send(receiver.url("/hooks/fail?mode=status&status=503"))
    assert answer.status_code == 503
    assert "told to fail" in answer.excerpt


def test_a_refused_connection_is_no_response():
    answer = send(f"http://127.0.0.1:{free_port()}/hooks")
    assert answer.status_code is None
    assert "ConnectError" in type(answer.error).__name__
