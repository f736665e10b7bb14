"""Hypothesis against the two routes outside the OpenAPI description's error shape, which
Schemathesis (``tests/test_api_fuzz.py``) does not cover: the rail callback and the OAuth
token endpoint. Whatever arrives, the answer is never a 5xx and always in the route's own
format. Django's test client against the real URLconf and database.

The assertions sent to the token endpoint are signed with a registered client's key, so
generated claims reach the checks behind the signature (times, ``jti``, the database).
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote_from_bytes

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.test import Client
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from charges.rails import forget_configured_rails
from merchants.clients import ASSERTION_TYPE, oauth_client_register
from merchants.services import merchant_create
from tests.charges_support import use_rails

pytestmark = pytest.mark.django_db

EXAMPLES = hypothesis_settings(
    max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
# Every character, surrogates and NUL included: JSON's escapes carry them.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=8,
)


def _dump(value) -> bytes:
    return json.dumps(value).encode()  # ensure_ascii: a lone surrogate goes as its escape


def nested(depth: int) -> bytes:
    return ("[" * depth + "]" * depth).encode()


CALLBACK_BODIES = st.one_of(
    st.binary(max_size=80),
    JSON_VALUE.map(_dump),
    st.fixed_dictionaries({"reference": JSON_VALUE}).map(_dump),
    st.fixed_dictionaries({"reference": ANY_TEXT}).map(_dump),
    st.integers(1, 8000).map(nested),
    st.integers(1, 3000).map(lambda n: ('{"reference":' * n + "1" + "}" * n).encode()),
)


@pytest.fixture
def rails(settings, tmp_path):
    use_rails(settings, tmp_path, {"momo": {"base_url": "https://rail.example", "flow": "push", "api_key": "k" * 20}})
    yield
    forget_configured_rails()  # the next test reads its own rails file


def test_the_rail_callback_answers_every_body_without_a_5xx(rails):
    client = Client(raise_request_exception=False)

    @EXAMPLES
    @given(body=CALLBACK_BODIES)
    def run(body: bytes) -> None:
        response = client.post("/rails/momo/callback", body, content_type="application/json")
        assert response.status_code in (200, 400, 413), (response.status_code, body[:200])
        answer = response.json()
        if response.status_code == 200:
            assert answer == {"received": True}
        else:
            assert set(answer) == {"error"} and set(answer["error"]) == {"type", "code", "message", "param"}

    run()


# --- the token endpoint ---------------------------------------------------------------------

TIME = st.one_of(
    st.integers(),
    st.integers(min_value=10**300, max_value=10**500) | st.integers(min_value=-(10**500), max_value=-(10**300)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(float("nan")),
    ANY_TEXT,
    st.none(),
    st.booleans(),
)
CLAIM = st.one_of(ANY_TEXT, st.integers(), st.floats(), st.none(), st.lists(ANY_TEXT, max_size=2), JSON_VALUE)


def _claims(client_id: str, audience: str):
    now = int(time.time())
    base = {"iss": client_id, "sub": client_id, "aud": audience, "iat": now, "exp": now + 60, "jti": "j"}
    overrides = st.fixed_dictionaries(
        {},
        optional={
            "exp": TIME,
            "nbf": TIME,
            "iat": TIME,
            "jti": CLAIM,
            "iss": CLAIM,
            "sub": CLAIM,
            "aud": CLAIM,
            "extra": JSON_VALUE,
        },
    )
    return st.builds(lambda o, jti: {**base, "jti": jti, **o}, overrides, st.uuids().map(str))


def _form(fields: dict[str, bytes]) -> bytes:
    return b"&".join(quote_from_bytes(k).encode() + b"=" + quote_from_bytes(v).encode() for k, v in fields.items())


def test_the_token_endpoint_answers_every_form_and_signed_assertion_without_a_5xx(settings):
    settings.VPAY_OAUTH_TOKEN_ADDRESS_RATE_LIMIT = settings.VPAY_OAUTH_TOKEN_RATE_LIMIT = 0
    merchant, _ = merchant_create(name="Acme")
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    registered = oauth_client_register(merchant_id=merchant.id, name="Backend", public_key=pem.decode())
    audience = "http://127.0.0.1:8000/v1/oauth/token"
    settings.VPAY_OAUTH_TOKEN_URL = audience
    client = Client(raise_request_exception=False)

    def check(response) -> None:
        assert response.status_code in (200, 400, 401, 429), (response.status_code, response.content[:300])
        answer = response.json()
        assert response["Cache-Control"] == "no-store"
        if response.status_code == 200:
            assert set(answer) == {"access_token", "token_type", "expires_in"}
        else:
            assert set(answer) == {"error", "error_description"}

    now = int(time.time())
    base = {"iss": registered.id, "sub": registered.id, "aud": audience, "exp": now + 60, "jti": "j"}

    @EXAMPLES
    @example(claims={**base, "iss": "cli_\x00"}, header={})  # each once answered 500
    @example(claims={**base, "jti": "j\ud800"}, header={})
    @example(claims={**base, "exp": float("nan")}, header={})
    @example(claims={**base, "exp": 10**400}, header={})
    @given(claims=_claims(registered.id, audience), header=st.fixed_dictionaries({}, optional={"kid": ANY_TEXT}))
    def signed(claims: dict, header: dict) -> None:
        payload = json.dumps(claims, allow_nan=True).encode()
        assertion = jwt.api_jws.encode(payload, private, algorithm="ES256", headers=header)
        form = {
            "grant_type": "client_credentials",
            "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": assertion,
        }
        check(
            client.post("/v1/oauth/token", _form({k.encode(): v.encode() for k, v in form.items()}), content_type=FORM)
        )

    @EXAMPLES
    @given(fields=st.dictionaries(st.binary(max_size=30), st.binary(max_size=60), max_size=6))
    def forms(fields: dict[bytes, bytes]) -> None:
        check(client.post("/v1/oauth/token", _form(fields), content_type=FORM))

    signed()
    forms()


FORM = "application/x-www-form-urlencoded"
