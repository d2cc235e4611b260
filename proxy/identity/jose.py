"""The only module touching JOSE: OIDC tokens (JWTs) and issuers' key sets (JWKS), through joserfc.

Nothing here is checked by hand: joserfc verifies the signature with the key the token names (`kid`), only
for the algorithms the caller allows, and only with a key of the algorithm's type (an RSA key never
verifies an HMAC, so a token "signed" with an issuer's public key as an HMAC secret fails even where HS256
were allowed, which it never is), and its claims registry checks `iss`, `aud`, `exp`, `nbf` and `iat` with
the leeway given. Every refusal is a `JwtError` with a short reason (for logs and metrics) and a message for
the client. Pure: CPU only, no I/O.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # joserfc (and cryptography under it) is imported on first use: only OIDC needs it
    from joserfc.jwk import KeySet


MIN_RSA_BITS = 2048
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp")


class JwtError(ValueError):
    """A token (or a key set) refused: `reason` is a short name for logs and metrics, the message says why."""

    def __init__(self, reason: str, message: str, subject: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.subject = subject  # set once the signature held: who the refused token was for


@dataclass(frozen=True)
class UnverifiedToken:
    """A token's header and claims as it states them, before anything is verified: only for choosing the
    issuer and the key to verify it with."""

    header: Mapping[str, Any]
    claims: Mapping[str, Any]

    @property
    def issuer(self) -> str | None:
        value = self.claims.get("iss")
        return value if isinstance(value, str) else None

    @property
    def key_id(self) -> str | None:
        value = self.header.get("kid")
        return value if isinstance(value, str) else None

    @property
    def algorithm(self) -> str:
        return str(self.header.get("alg", ""))


def looks_like_jwt(text: str) -> bool:
    """Three base64url parts, the first a JSON object: a JWS in compact form (a static token never is one)."""
    parts = text.split(".")
    return len(parts) == 3 and text.startswith("eyJ") and all(_is_base64url(part) for part in parts[:2])


def _is_base64url(part: str) -> bool:
    return bool(part) and all(c.isascii() and (c.isalnum() or c in "-_") for c in part)


def peek(token: str) -> UnverifiedToken:
    """The header and claims a token states (unverified); JwtError `malformed` if it is no JWT."""
    from joserfc import jws
    from joserfc.errors import JoseError

    try:
        compact = jws.extract_compact(token.encode("ascii"))
        claims = json.loads(compact.payload)
    except (JoseError, ValueError, TypeError, UnicodeError):
        raise JwtError("malformed", "the token is not a JWT (three base64url parts of JSON)") from None
    if not isinstance(claims, dict):
        raise JwtError("malformed", "the token's payload is not a JSON object of claims")
    return UnverifiedToken(dict(compact.headers()), claims)


class SigningKeys:
    """An issuer's public signing keys (its JWKS), with what cannot sign a token left out: symmetric keys,
    keys for encryption, RSA keys under 2048 bits, keys this library cannot read."""

    def __init__(self, keys: list[Any], document: dict[str, Any]) -> None:
        from joserfc.jwk import KeySet

        self._set: KeySet = KeySet(keys)
        self.document = document  # the published JWKS as fetched (public keys only)
        self.key_ids = frozenset(key.kid for key in keys if key.kid)

    @classmethod
    def from_jwks(cls, raw: bytes) -> SigningKeys:
        """Parse a JWKS document; JwtError `bad_jwks` when it holds no usable signing key."""
        try:
            document = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise JwtError("bad_jwks", "the issuer's JWKS is not JSON") from None
        if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
            raise JwtError("bad_jwks", "the issuer's JWKS has no `keys` list")
        keys = []
        for entry in document["keys"]:
            key = _signing_key(entry)
            if key is not None:
                keys.append(key)
        if not keys:
            raise JwtError("bad_jwks", "the issuer's JWKS holds no usable signing key")
        public = {"keys": [entry for entry in document["keys"] if isinstance(entry, dict) and "d" not in entry]}
        return cls(keys, public)

    def has(self, key_id: str | None) -> bool:
        """Whether a token naming `key_id` has its key here (no kid: only a set of one key can answer)."""
        return key_id in self.key_ids if key_id is not None else len(self._set.keys) == 1

    def verify(
        self,
        token: str,
        *,
        issuer: str,
        audiences: Collection[str],
        algorithms: Collection[str],
        leeway: float,
        now: float | None = None,
    ) -> dict[str, Any]:
        """The claims of `token` once its signature (by one of these keys, with an allowed algorithm) and its
        registered claims hold; JwtError saying why not."""
        from joserfc import jwt
        from joserfc.errors import (
            BadSignatureError,
            InvalidKeyIdError,
            JoseError,
            SecurityWarning,
            UnsupportedAlgorithmError,
        )

        stated = peek(token)
        if stated.algorithm not in algorithms:
            raise JwtError(
                "algorithm_refused",
                f"the token is signed with {stated.algorithm or 'no algorithm'!r}; this issuer's tokens are "
                f"accepted with {', '.join(algorithms)} only",
            )
        try:
            with (
                warnings.catch_warnings()
            ):  # RFC 9864 renamed EdDSA Ed25519: issuers sign with it, the operator chose it
                warnings.simplefilter("ignore", SecurityWarning)
                decoded = jwt.decode(token, self._set, algorithms=list(algorithms))
        except UnsupportedAlgorithmError:
            raise JwtError("algorithm_refused", f"the token's algorithm {stated.algorithm!r} is not accepted") from None
        except InvalidKeyIdError:
            if stated.key_id in self.key_ids:  # a key the issuer has, for another algorithm
                raise JwtError(
                    "bad_signature", f"the token's key {stated.key_id!r} is not a {stated.algorithm} key"
                ) from None
            raise JwtError("unknown_key", _unknown_key(stated.key_id)) from None
        except BadSignatureError:
            raise JwtError(
                "bad_signature", "the token's signature does not verify (tampered with, or signed by another key)"
            ) from None
        except JoseError as exc:
            raise JwtError("bad_signature", f"the token was refused: {exc.description or exc.error}") from None
        try:
            check_claims(decoded.claims, issuer, audiences, leeway, time.time() if now is None else now)
        except JwtError as exc:
            exc.subject = str(decoded.claims.get("sub", ""))[:200] or None
            raise
        return decoded.claims


def _signing_key(entry: object) -> Any | None:
    from joserfc.errors import JoseError, SecurityWarning
    from joserfc.jwk import JWKRegistry, OctKey, RSAKey

    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") == "oct":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SecurityWarning)
            key = JWKRegistry.import_key({name: value for name, value in entry.items() if name != "d"})
    except (JoseError, ValueError, TypeError, KeyError):
        return None
    if isinstance(key, OctKey) or (isinstance(key, RSAKey) and key.raw_value.key_size < MIN_RSA_BITS):
        return None
    return key


def _unknown_key(key_id: str | None) -> str:
    if key_id is None:
        return "the token names no signing key (`kid`), and the issuer publishes several"
    return f"the token's signing key (kid {key_id[:100]!r}) is not one the issuer publishes"


def check_claims(claims: Mapping[str, Any], issuer: str, audiences: Collection[str], leeway: float, now: float) -> None:
    """The registered claims hold: `iss` is `issuer`, `aud` names one of `audiences`, `exp` is ahead and `nbf`
    and `iat` are not (each within `leeway`), `sub` is there; JwtError saying which does not. Also run on a
    token's stated claims before its keys are looked up, so a token refused anyway makes no key fetch."""
    from joserfc import jwt
    from joserfc.errors import ClaimError, ExpiredTokenError, MissingClaimError

    registry = jwt.JWTClaimsRegistry(
        now=int(now),
        leeway=int(leeway),
        iss={"essential": True, "value": issuer},
        sub={"essential": True},
        aud={"essential": True, "values": list(audiences)},
        exp={"essential": True},
    )
    try:
        registry.validate(dict(claims))
    except ExpiredTokenError:
        raise JwtError("expired", f"the token expired at {_when(claims.get('exp'))}; ask for a fresh one") from None
    except MissingClaimError as exc:
        raise JwtError(
            "missing_claim", f"the token lacks the claims {exc.claim} (needed: iss, sub, aud, exp)"
        ) from None
    except ClaimError as exc:
        raise _claim_error(exc.claim, claims, issuer, audiences) from None


def _claim_error(claim: str, claims: Mapping[str, Any], issuer: str, audiences: Collection[str]) -> JwtError:
    if claim == "aud":
        return JwtError(
            "wrong_audience",
            f"the token is for the audience {claims.get('aud')!r}, not one of {', '.join(audiences)} "
            "(request the token with this proxy's audience)",
        )
    if claim == "iss":
        return JwtError("wrong_issuer", f"the token's issuer {str(claims.get('iss'))[:200]!r} is not {issuer}")
    if claim in ("nbf", "iat"):
        return JwtError(
            "not_yet_valid",
            f"the token is not valid before {_when(claims.get(claim))} (`{claim}`); is a clock wrong?",
        )
    return JwtError("bad_claim", f"the token's `{claim}` claim is invalid")


def _when(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(value, UTC).isoformat().replace("+00:00", "Z")
        except (OverflowError, ValueError, OSError):
            pass
    return repr(value)[:40]
