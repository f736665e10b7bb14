"""Kept connections keep the pin (webhooks/services/transport.py): a real HTTP/1.1 keep-alive
server on the loopback addresses, real sockets; no database.

The server records, for every request, the client's port (one port = one TCP connection),
the local address the client dialled and the Host header: what the pin promises is read
off the receiving end."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from webhooks.services.transport import KeptConnections, post

BODY = b'{"id":"evt_k1","object":"event","type":"test.ping"}'
FIRST = ipaddress.ip_address("127.0.0.1")
SECOND = ipaddress.ip_address("127.0.0.2")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a response says otherwise

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.open.append(self.connection)
        self.answered = getattr(self, "answered", 0)
        if self.server.close_on_reuse and self.answered:
            # Its idle timeout fired as the request arrived: closed, nothing answered.
            self.server.unanswered.append(self.client_address[1])
            self.close_connection = True
            return
        self.answered += 1
        self.server.seen.append(
            {
                "client_port": self.client_address[1],
                "dialled": self.connection.getsockname()[0],
                "host": self.headers["Host"].split(":")[0],
                "path": self.path,
                "accept_encoding": self.headers.get("Accept-Encoding"),
            }
        )
        body = b"x" * 20_000 if "big" in self.path else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet
        pass


def serve(address: str, port: int = 0) -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer((address, port), _Handler)
    httpd.seen, httpd.open, httpd.unanswered, httpd.close_on_reuse = [], [], [], False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def drop_idle_connections(httpd: ThreadingHTTPServer) -> None:
    """The server closes every connection it holds open (as its keep-alive timeout would),
    and the client has seen the close by the time this returns."""
    for sock in httpd.open:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    time.sleep(0.1)  # the FIN crosses the loopback


def shut(httpd: ThreadingHTTPServer) -> None:
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def server():
    # Every local address: the tests dial it on 127.0.0.1 and on 127.0.0.2.
    httpd = serve("0.0.0.0")
    yield httpd
    shut(httpd)


def send(server, host: str, addresses, keep: KeptConnections | None, path: str = "/hook"):
    return post(
        f"http://{host}:{server.server_address[1]}{path}",
        BODY,
        {},
        addresses=addresses,
        connect_timeout=2.0,
        total_timeout=5.0,
        keep=keep,
    )


def connections(server) -> list[int]:
    return [r["client_port"] for r in server.seen]


def test_a_kept_connection_is_reused_for_the_same_host_and_vetted_address(server):
    keep = KeptConnections(8)
    for _ in range(3):
        answer = send(server, "hooks.example", [FIRST], keep)
        assert answer.status_code == 200 and answer.connected_to == ("127.0.0.1", server.server_address[1])
    assert len(set(connections(server))) == 1  # one TCP connection for three attempts
    assert {r["host"] for r in server.seen} == {"hooks.example"}
    assert len(keep) == 1
    # The excerpt is stored as read: the body is asked for uncompressed.
    assert {r["accept_encoding"] for r in server.seen} == {"identity"}


def test_a_dead_kept_connection_is_redialled_only_to_the_address_vetted_now():
    # The first attempt was vetted [127.0.0.2, 127.0.0.1]: .2 refused, .1 answered and its
    # connection was kept. Now the host resolves to .1 only, and something listens on .2.
    # The kept connection has died meanwhile: its re-dial may go to .1, never back to .2.
    first = serve("127.0.0.1")
    port = first.server_address[1]
    keep = KeptConnections(8)
    try:
        answer = send(first, "hooks.example", [SECOND, FIRST], keep)
        assert answer.status_code == 200 and answer.connected_to == ("127.0.0.1", port)
        assert len(keep) == 1
        drop_idle_connections(first)
        second = serve("127.0.0.2", port)
        try:
            answer = send(first, "hooks.example", [FIRST], keep)
            assert answer.status_code == 200 and answer.connected_to == ("127.0.0.1", port)
            assert second.seen == []
            assert len(set(connections(first))) == 2
        finally:
            shut(second)
    finally:
        shut(first)


def test_a_kept_connection_closed_as_it_is_reused_is_sent_again_over_a_fresh_one(server):
    # The receiver's idle timeout fires as the next request goes out on the kept
    # connection: a disconnect before any status. That is the pool's failure, not the
    # receiver's: the same request goes once more, over a new connection, and is heard.
    keep = KeptConnections(8)
    assert send(server, "hooks.example", [FIRST], keep).status_code == 200
    server.close_on_reuse = True
    answer = send(server, "hooks.example", [FIRST], keep)
    assert answer.status_code == 200 and answer.error is None and answer.sent
    assert len(server.unanswered) == 1
    assert len(server.seen) == 2 and len(set(connections(server))) == 2


def test_an_unparsable_url_is_an_answer_that_sent_nothing():
    answer = post("http://[::1", BODY, {}, addresses=[FIRST], connect_timeout=1.0, total_timeout=1.0)
    assert (answer.status_code, answer.sent) == (None, False)
    assert answer.error is not None


def test_a_host_that_now_resolves_elsewhere_is_never_reached_over_the_old_connection(server):
    keep = KeptConnections(8)
    send(server, "hooks.example", [FIRST], keep)
    # The fresh resolution no longer returns the first address: the kept connection to it
    # must not carry this attempt, which goes to the address vetted now.
    answer = send(server, "hooks.example", [SECOND], keep)
    assert answer.status_code == 200 and answer.connected_to == ("127.0.0.2", server.server_address[1])
    first, second = server.seen
    assert (first["dialled"], second["dialled"]) == ("127.0.0.1", "127.0.0.2")
    assert first["client_port"] != second["client_port"]


def test_a_connection_is_never_lent_to_another_host_on_the_same_address(server):
    keep = KeptConnections(8)
    send(server, "one.example", [FIRST], keep)
    send(server, "two.example", [FIRST], keep)
    send(server, "one.example", [FIRST], keep)
    one_a, two, one_b = server.seen
    assert two["client_port"] not in (one_a["client_port"], one_b["client_port"])
    assert one_a["client_port"] == one_b["client_port"]


def test_an_answer_cut_at_the_excerpt_is_not_kept(server):
    keep = KeptConnections(8)
    answer = send(server, "hooks.example", [FIRST], keep, "/big")
    assert answer.status_code == 200 and len(answer.excerpt) == 4096
    assert len(keep) == 0
    send(server, "hooks.example", [FIRST], keep)
    assert len(set(connections(server))) == 2


def test_a_kept_connection_the_receiver_closed_is_replaced_without_an_error(server):
    keep = KeptConnections(8)
    send(server, "hooks.example", [FIRST], keep)
    drop_idle_connections(server)
    answer = send(server, "hooks.example", [FIRST], keep)
    assert answer.status_code == 200 and answer.error is None
    assert len(set(connections(server))) == 2
    assert server.seen[1]["dialled"] == "127.0.0.1"
    assert server.unanswered == []  # the close was seen before sending: nothing was resent


def test_without_a_pool_every_attempt_opens_its_own_connection(server):
    for _ in range(2):
        assert send(server, "hooks.example", [FIRST], None).status_code == 200
    assert len(set(connections(server))) == 2


def test_the_pool_keeps_at_most_its_limit_and_closes_the_least_recently_used(server):
    keep = KeptConnections(1)
    send(server, "one.example", [FIRST], keep)
    send(server, "two.example", [FIRST], keep)  # evicts one.example's connection
    send(server, "one.example", [FIRST], keep)
    assert len(keep) == 1
    assert len(set(connections(server))) == 3
