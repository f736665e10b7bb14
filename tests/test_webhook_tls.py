"""The pinned connection still checks TLS against the configured hostname (SNI and the
certificate), not against the IP it was pinned to. A real TLS server on loopback with a
certificate made here for one name; no database."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from webhooks.services.transport import post

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


def certificate(tmp_path, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path):
    """A TLS receiver on 127.0.0.1 presenting a certificate for ``hooks.merchant.test`` only;
    it records the SNI name each handshake asked for."""
    cert_path, key_path = certificate(tmp_path, "hooks.merchant.test")
    seen_sni: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    context.sni_callback = lambda sock, name, ctx: seen_sni.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], cert_path, seen_sni
    server.shutdown()
    server.server_close()


def client_context(cert_path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cert_path))
    return context


def test_a_pinned_https_delivery_verifies_the_configured_hostname(tls_server):
    port, cert_path, seen_sni = tls_server
    answer = post(
        f"https://hooks.merchant.test:{port}/hook",  # not resolvable: the pin is the only way there
        b"{}",
        {},
        addresses=LOOPBACK,
        connect_timeout=2,
        total_timeout=5,
        ssl_context=client_context(cert_path),
    )
    assert answer.status_code == 200, answer.error
    assert answer.connected_to == ("127.0.0.1", port) and answer.sent
    assert seen_sni == ["hooks.merchant.test"]


def test_a_certificate_for_another_name_fails_even_though_the_ip_is_the_vetted_one(tls_server):
    port, cert_path, _ = tls_server
    answer = post(
        f"https://evil.merchant.test:{port}/hook",
        b"{}",
        {},
        addresses=LOOPBACK,
        connect_timeout=2,
        total_timeout=5,
        ssl_context=client_context(cert_path),
    )
    assert answer.status_code is None
    assert "CERTIFICATE_VERIFY_FAILED" in str(answer.error) or "hostname" in str(answer.error).lower()
    assert not answer.sent  # the handshake failed: not one byte of the request went out
