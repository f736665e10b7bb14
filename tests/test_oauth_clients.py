"""OAuth clients with private_key_jwt client assertions, over HTTP against a live server
(pytest-django's ``live_server``: a real socket, the real URLconf, the real database).

Keys are generated here with ``cryptography``; assertions are signed with PyJWT as a
merchant's client would sign them.
"""

from __future__ import annotations

import logging
import time
import uuid

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.core.management import call_command
from django.core.management.base import CommandError

from merchants import sweeps
from merchants.clients import ASSERTION_TYPE, assertion_time_refusal, oauth_client_register, oauth_client_revoke
from merchants.models import AccessToken, AssertionJti
from merchants.services import merchant_create
from tests.charges_support import scalar, sql
from vpay.errors import InvalidInput

pytestmark = pytest.mark.django_db(transaction=True)


def _pem(private) -> str:
    return (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


KEY_TYPES = {
    "RS256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "EdDSA": ed25519.Ed25519PrivateKey.generate,
}


class Api:
    """The live server as a merchant's OAuth client sees it."""

    def __init__(self, base: str, *, alg: str = "ES256") -> None:
        self.base = base
        self.token_url = base + "/v1/oauth/token"
        self.merchant, self.secret_key = merchant_create(name="Acme")
        self.alg = alg
        self.private = KEY_TYPES[alg]()
        self.client = oauth_client_register(merchant_id=self.merchant.id, name="Backend", public_key=_pem(self.private))

    def assertion(self, *, key=None, alg: str | None = None, headers: dict | None = None, **claims) -> str:
        now = int(time.time())
        body = {
            "iss": self.client.id,
            "sub": self.client.id,
            "aud": self.token_url,
            "iat": now,
            "exp": now + 120,
            "jti": uuid.uuid4().hex,
        }
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.private, algorithm=alg or self.alg, headers=headers)

    def token(self, assertion: str | None = None, **form) -> httpx.Response:
        data = {
            "grant_type": "client_credentials",
            "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": assertion if assertion is not None else self.assertion(),
            **form,
        }
        return httpx.post(self.token_url, data=data, timeout=10)

    def get(self, path: str, credential: str) -> httpx.Response:
        return httpx.get(self.base + path, headers={"Authorization": f"Bearer {credential}"}, timeout=10)


@pytest.fixture
def api(live_server, settings):
    settings.VPAY_PUBLIC_URL = live_server.url  # the token URL, hence the only aud accepted
    return Api(live_server.url)


@pytest.mark.parametrize("alg", list(KEY_TYPES))
def test_a_good_assertion_gets_a_bearer_token_that_authenticates_as_the_clients_merchant(live_server, settings, alg):
    settings.VPAY_PUBLIC_URL = live_server.url
    api = Api(live_server.url, alg=alg)
    customer = httpx.post(
        api.base + "/v1/customers", json={"name": "Pat"}, headers={"Authorization": f"Bearer {api.secret_key}"}
    ).json()
    response = api.token()
    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json()
    assert body["token_type"] == "Bearer" and body["expires_in"] == 900 and body["access_token"].startswith("at_test_")
    listed = api.get("/v1/customers", body["access_token"])
    assert listed.status_code == 200 and [c["id"] for c in listed.json()["data"]] == [customer["id"]]
    # Only a digest is stored; the secret key keeps working beside the client.
    assert not AccessToken.objects.filter(digest=body["access_token"]).exists()
    assert api.get("/v1/customers", api.secret_key).status_code == 200


def _refusal(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error", "error_description"} and "access_token" not in body
    return body["error"]


BAD_ASSERTIONS = {
    "expired": lambda api: api.assertion(exp=int(time.time()) - 120, iat=int(time.time()) - 200),
    "exp more than 5 min ahead": lambda api: api.assertion(exp=int(time.time()) + 3600),
    "no exp": lambda api: api.assertion(exp=None),
    "no jti": lambda api: api.assertion(jti=None),
    "wrong aud": lambda api: api.assertion(aud="https://elsewhere.example/v1/oauth/token"),
    "wrong iss": lambda api: api.assertion(iss="cli_doesnotexist000000000000"),
    "sub is not iss": lambda api: api.assertion(sub="cli_someoneelse00000000000000"),
    "bad signature": lambda api: api.assertion(key=ec.generate_private_key(ec.SECP256R1())),
    "alg none": lambda api: jwt.encode(
        {"iss": api.client.id, "sub": api.client.id, "aud": api.token_url, "exp": int(time.time()) + 60, "jti": "x"},
        None,
        algorithm="none",
    ),
    "HS256 keyed with the public key": lambda api: _hs256_with_public_key(api),
    "alg of another key type": lambda api: api.assertion(key=rsa.generate_private_key(65537, 2048), alg="RS256"),
    "not a JWT": lambda api: "not-a-jwt",
    # Text the database cannot hold, in the claims it is asked about: iss before any
    # signature is checked, jti once it is.
    "iss with a NUL": lambda api: api.assertion(iss="cli_\x00"),
    "iss with a lone surrogate": lambda api: api.assertion(iss="cli_\ud800"),
    "jti with a NUL": lambda api: api.assertion(jti="j\x00"),
    "jti with a lone surrogate": lambda api: api.assertion(jti="j\ud800"),
}


def _hs256_with_public_key(api: Api) -> str:
    # The algorithm-confusion forgery: an HMAC whose key is the (public) PEM. PyJWT refuses
    # to sign with a PEM key, so the JWS is assembled here, as an attacker would.
    import base64
    import hashlib
    import hmac
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    claims = {
        "iss": api.client.id,
        "sub": api.client.id,
        "aud": api.token_url,
        "exp": int(time.time()) + 60,
        "jti": "h",
    }
    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(json.dumps(claims).encode())
    mac = hmac.new(_pem(api.private).encode(), signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(mac)


@pytest.mark.parametrize("case", list(BAD_ASSERTIONS))
def test_a_bad_assertion_is_invalid_client_and_grants_nothing(api, case, caplog):
    assertion = BAD_ASSERTIONS[case](api)
    with caplog.at_level(logging.INFO):
        response = api.token(assertion)
    assert (response.status_code, _refusal(response)) == (401, "invalid_client"), response.text
    assert AccessToken.objects.count() == 0
    assert assertion not in caplog.text


def test_a_replayed_jti_is_refused_and_so_is_a_new_assertion_reusing_it(api):
    assertion = api.assertion(jti="once")
    assert api.token(assertion).status_code == 200
    replay = api.token(assertion)
    assert (replay.status_code, _refusal(replay)) == (401, "invalid_client") and "jti" in replay.json()[
        "error_description"
    ]
    assert api.token(api.assertion(jti="once")).status_code == 401
    assert AccessToken.objects.count() == 1


def test_a_revoked_client_gets_no_token_and_its_tokens_stop_working(api):
    issued = api.token().json()["access_token"]
    assert api.get("/v1/customers", issued).status_code == 200
    oauth_client_revoke(client_id=api.client.id, reason="key pair retired")
    assert api.get("/v1/customers", issued).status_code == 401
    refused = api.token()
    assert (refused.status_code, _refusal(refused)) == (401, "invalid_client")


def test_an_expired_token_does_not_authenticate(api):
    issued = api.token().json()["access_token"]
    # Expiry is the database clock's: move the row's end just past now().
    sql("UPDATE oauth_access_tokens SET expires_at = now() - interval '1 second'")
    response = api.get("/v1/customers", issued)
    assert response.status_code == 401 and response.json()["error"]["code"] == "access_token_invalid"


@pytest.mark.parametrize(
    ("form", "status", "error"),
    [
        ({"grant_type": "authorization_code"}, 400, "unsupported_grant_type"),
        ({"grant_type": ""}, 400, "invalid_request"),
        ({"client_assertion_type": "urn:example:other"}, 400, "invalid_request"),
        ({"client_assertion": ""}, 400, "invalid_request"),
        ({"client_id": "cli_notthisone000000000000000"}, 401, "invalid_client"),
    ],
)
def test_malformed_token_requests_answer_in_rfc_6749_shape(api, form, status, error):
    response = api.token(**form)
    assert (response.status_code, _refusal(response)) == (status, error)


def test_the_token_endpoint_takes_a_form_post_only(api):
    assert httpx.get(api.token_url).status_code == 405
    as_json = httpx.post(api.token_url, json={"grant_type": "client_credentials"})
    assert (as_json.status_code, _refusal(as_json)) == (400, "invalid_request")


def test_the_sweep_deletes_expired_jtis_and_tokens_and_keeps_live_ones(api):
    for _ in range(2):
        assert api.token().status_code == 200
    sql(
        "UPDATE oauth_assertion_jtis SET expires_at = now() - interval '1 second' WHERE id = (SELECT min(id) FROM oauth_assertion_jtis)"
    )
    sql(
        "UPDATE oauth_access_tokens SET expires_at = now() - interval '1 second' WHERE id = (SELECT min(id) FROM oauth_access_tokens)"
    )
    ctx = type("Ctx", (), {"heartbeat": lambda self: None})()
    assert sweeps.sweep_expired_jtis(ctx).count == 1 and sweeps.sweep_expired_access_tokens(ctx).count == 1
    assert AssertionJti.objects.count() == 1 and AccessToken.objects.count() == 1
    assert scalar("SELECT count(*) FROM oauth_access_tokens WHERE expires_at > now()") == 1


# --- registration --------------------------------------------------------------------------


def test_createclient_registers_a_public_key_and_prints_the_client_id(tmp_path, capsys):
    merchant, _ = merchant_create(name="Acme")
    pem = tmp_path / "client.pub"
    pem.write_text(_pem(ec.generate_private_key(ec.SECP256R1())))
    call_command("createclient", merchant.id, "--name", "Backend", "--public-key", str(pem))
    client_id = capsys.readouterr().out.strip()
    assert client_id.startswith("cli_") and merchant.oauth_clients.get().id == client_id


@pytest.mark.parametrize(
    ("pem", "code"),
    [
        ("nonsense", "public_key_invalid"),
        ("PRIVATE", "private_key_given"),
        ("RSA1024", "public_key_unsupported"),
        ("P384", "public_key_unsupported"),
    ],
)
def test_a_key_vpay_cannot_use_is_refused_at_registration_and_a_private_key_is_not_echoed(pem, code):
    merchant, _ = merchant_create(name="Acme")
    if pem == "PRIVATE":
        pem = (
            ec.generate_private_key(ec.SECP256R1())
            .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            .decode()
        )
    elif pem == "RSA1024":
        pem = _pem(rsa.generate_private_key(65537, 1024))
    elif pem == "P384":
        pem = _pem(ec.generate_private_key(ec.SECP384R1()))
    with pytest.raises(InvalidInput) as refused:
        oauth_client_register(merchant_id=merchant.id, name="x", public_key=pem)
    assert refused.value.code == code and pem not in str(refused.value)
    with pytest.raises(CommandError):
        call_command("createclient", "acct_nobody", "--name", "x", "--public-key", "/nonexistent")


# --- the times, against the database clock: a pure table ------------------------------------

NOW = 1_800_000_000


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize(
    ("exp", "nbf", "iat", "refused"),
    [
        (NOW + 60, None, None, None),
        (NOW + 300, None, None, None),
        (NOW + 330, None, None, None),  # within the leeway
        (NOW + 331, None, None, "ahead"),
        (NOW - 29, None, None, None),  # expired within the leeway
        (NOW - 30, None, None, "expired"),
        ("soon", None, None, "NumericDate"),
        (True, None, None, "NumericDate"),
        (NOW + 60, NOW + 31, None, "nbf is in the future"),
        (NOW + 60, NOW + 30, None, None),
        (NOW + 60, None, NOW + 31, "iat is in the future"),
        (NOW + 60, None, "x", "iat must be"),
        (NOW + 60, NOW - 10, NOW - 10, None),
        (float("nan"), None, None, "NumericDate"),
        (float("inf"), None, None, "NumericDate"),
        (float("-inf"), None, None, "NumericDate"),
        (NOW + 60, float("nan"), None, "nbf must be"),
        (NOW + 60, None, float("-inf"), "iat must be"),
        (10**400, None, None, "ahead"),  # an int past any float: compared, not converted
        (-(10**400), None, None, "expired"),
        (NOW + 60, 10**400, None, "nbf is in the future"),
    ],
)
def test_the_assertion_time_table(exp, nbf, iat, refused):
    got = assertion_time_refusal(now=NOW, exp=exp, nbf=nbf, iat=iat)
    assert (got is None) if refused is None else (got is not None and refused in got)


# --- abuse: non-finite times, rate limits, the live-token cap (issue 23 item 9) -------------


@pytest.mark.parametrize("claim", ["exp", "nbf", "iat"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_time_is_invalid_client_not_a_500(api, claim, value, caplog):
    with caplog.at_level(logging.INFO):
        response = api.token(api.assertion(**{claim: value}))
    assert (response.status_code, _refusal(response)) == (401, "invalid_client"), response.text
    assert AccessToken.objects.count() == 0 and AssertionJti.objects.count() == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _limited(response: httpx.Response, error: str) -> int:
    assert (response.status_code, _refusal(response)) == (429, error), response.text
    assert response.headers["Cache-Control"] == "no-store"
    return int(response.headers["Retry-After"])


def test_the_token_endpoint_is_rate_limited_per_client(api, live_server, settings):
    settings.VPAY_OAUTH_TOKEN_RATE_LIMIT, settings.VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS = 2, 60
    settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT = 0
    other = Api(live_server.url)  # another merchant's client, from the same address
    assert [api.token().status_code for _ in range(2)] == [200, 200]
    assert 1 <= _limited(api.token(), "rate_limited") <= 60
    assert AccessToken.objects.count() == 2
    assert other.token().status_code == 200  # the window is the client's own
    # An assertion that does not verify names no client: it cannot spend a client's window.
    forged = api.assertion(key=ec.generate_private_key(ec.SECP256R1()))
    assert other.token(forged).status_code == 401


def test_the_token_endpoint_is_rate_limited_per_source_address(api, live_server, settings):
    settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT, settings.VPAY_OAUTH_TOKEN_RATE_LIMIT_WINDOW_SECONDS = 3, 60
    settings.VPAY_OAUTH_TOKEN_RATE_LIMIT = 0
    # Refusals count too: garbage from one address is bounded before any key is touched.
    assert [api.token("not-a-jwt").status_code for _ in range(3)] == [401, 401, 401]
    _limited(api.token(), "rate_limited")
    assert AccessToken.objects.count() == 0


def test_a_client_holds_at_most_the_cap_of_live_tokens(api, settings):
    settings.VPAY_OAUTH_MAX_LIVE_TOKENS = 2
    settings.VPAY_OAUTH_TOKEN_RATE_LIMIT = settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT = 0
    first = api.token().json()["access_token"]
    assert api.token().status_code == 200
    assert 1 <= _limited(api.token(), "too_many_tokens") <= settings.VPAY_OAUTH_TOKEN_TTL_SECONDS
    assert AccessToken.objects.count() == 2 and api.get("/v1/customers", first).status_code == 200
    # A refused assertion left its jti unused: the same one is accepted once a token expires.
    assertion = api.assertion()
    assert api.token(assertion).status_code == 429
    sql(
        "UPDATE oauth_access_tokens SET expires_at = now() - interval '1 second' WHERE id = (SELECT min(id) FROM oauth_access_tokens)"
    )
    assert api.token(assertion).status_code == 200
