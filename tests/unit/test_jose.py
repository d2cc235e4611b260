"""OIDC tokens checked through joserfc: real RS256, ES256 and EdDSA signatures; every forgery refused by name."""

from __future__ import annotations

import json
import ssl
import time

import pytest
from joserfc.errors import SecurityWarning
from joserfc.jwk import OctKey, RSAKey

from proxy.identity.jose import JwtError, SigningKeys, looks_like_jwt, peek
from tests.fakes.oidc import AUDIENCE, SUBJECT, FakeIssuer


@pytest.fixture(scope="module")
def issuer() -> FakeIssuer:
    fake = FakeIssuer(ssl.create_default_context())
    fake.port = 8443  # never started: only its keys and tokens are used
    return fake


def check(issuer: FakeIssuer, token: str, keys: SigningKeys | None = None, **options) -> dict:
    keys = keys or SigningKeys.from_jwks(json.dumps(issuer.jwks()).encode())
    settings = {"issuer": issuer.url, "audiences": [AUDIENCE], "algorithms": ["RS256", "ES256", "EdDSA"], "leeway": 30}
    return keys.verify(token, **{**settings, **options})


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
def test_real_signatures_of_each_algorithm_verify(issuer, alg):
    token = issuer.mint(alg)
    assert looks_like_jwt(token) and peek(token).key_id == issuer.kid(alg) and peek(token).issuer == issuer.url
    assert check(issuer, token)["sub"] == SUBJECT
    with pytest.raises(JwtError) as refused:  # an issuer that accepts only RS256
        check(issuer, token, algorithms=["RS256"]) if alg != "RS256" else check(issuer, token, algorithms=["ES256"])
    assert refused.value.reason == "algorithm_refused"


def refusal(issuer, token, **options) -> tuple[str, str]:
    with pytest.raises(JwtError) as refused:
        check(issuer, token, **options)
    return refused.value.reason, refused.value.message


def test_every_forgery_and_mistake_is_refused_by_name(issuer):
    now = int(time.time())
    cases = {
        "expired": (issuer.mint(exp=now - 31, iat=now - 600, nbf=now - 600), "expired at"),
        "not_yet_valid": (issuer.mint(nbf=now + 120), "not valid before"),
        "wrong_audience": (issuer.mint(aud="https://someone-else.example"), "someone-else"),
        "wrong_issuer": (issuer.mint(iss="https://evil.example"), "evil.example"),
        "unknown_key": (issuer.mint(kid="made-up"), "'made-up'"),
        "bad_signature": (issuer.tampered(repository_owner="evil"), "does not verify"),
        "missing_claim": (issuer.mint(sub=None), "sub"),
    }
    for reason, (token, said) in cases.items():
        got, message = refusal(issuer, token)
        assert (got, said in message) == (reason, True), (reason, message)
    assert refusal(issuer, issuer.unsigned())[0] == "algorithm_refused"
    assert refusal(issuer, issuer.hmac_with_public_key())[0] == "algorithm_refused"
    # even an issuer configured (wrongly) for HS256 would not verify it with its RSA key
    assert refusal(issuer, issuer.hmac_with_public_key(), algorithms=["HS256"])[0] == "bad_signature"
    # a token within the leeway is accepted; the leeway is the issuer's
    assert check(issuer, issuer.mint(exp=now - 10))["sub"] == SUBJECT
    assert refusal(issuer, issuer.mint(exp=now - 10), leeway=0)[0] == "expired"
    # once the signature held, the refusal knows whose token it was
    with pytest.raises(JwtError) as refused:
        check(issuer, issuer.mint(aud="other"))
    assert refused.value.subject == SUBJECT


def test_an_es256_token_cannot_use_an_rsa_key(issuer):
    token = issuer.mint("ES256", kid=issuer.kid("RS256"))
    assert refusal(issuer, token)[0] == "bad_signature"


@pytest.mark.parametrize("text", ["rpt_static-token", "a.b.c", "eyJ.x", "", "eyJhbGciOiJub25lIn0..."])
def test_what_is_not_a_jwt(text):
    assert not looks_like_jwt(text) or text.startswith("eyJhbGci")
    if text != "eyJhbGciOiJub25lIn0...":
        with pytest.raises(JwtError, match="not a JWT"):
            peek(text)


def test_a_key_set_keeps_only_what_can_sign(issuer):
    with pytest.warns(SecurityWarning):  # joserfc warns of it too
        small = RSAKey.generate_key(1024, parameters={"kid": "small"}).as_dict(private=False)
    secret = OctKey.generate_key(256, parameters={"kid": "secret"}).as_dict(private=True)
    encryption = {**RSAKey.generate_key(2048, parameters={"kid": "enc"}).as_dict(private=False), "use": "enc"}
    published = issuer.jwks()["keys"]
    document = {"keys": [*published, small, secret, encryption, {"kty": "RSA", "kid": "broken"}, "junk"]}
    keys = SigningKeys.from_jwks(json.dumps(document).encode())
    assert keys.key_ids == {issuer.kid(alg) for alg in ("RS256", "ES256", "EdDSA")}
    assert keys.has(issuer.kid()) and not keys.has("small") and not keys.has(None)
    for raw in (b"nope", b"[]", b'{"keys": 1}', json.dumps({"keys": [small, secret]}).encode()):
        with pytest.raises(JwtError) as refused:
            SigningKeys.from_jwks(raw)
        assert refused.value.reason == "bad_jwks"
    one = SigningKeys.from_jwks(json.dumps({"keys": [published[0]]}).encode())
    assert one.has(None)  # a token without a kid: a set of one key answers it
