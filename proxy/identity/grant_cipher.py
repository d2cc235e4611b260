"""The cipher that makes an OIDC client's archive grants opaque (`proxy.identity.tokens.Grants`).

A grant made for an OIDC client must say who it was made for (its issuer, subject and the claims that granted
access are judged again by the rules in force when it is used), yet anyone who sees the URL, in a CI log say,
must read nothing of it. The identity is therefore encrypted with AES-SIV (RFC 5297, `cryptography`'s `AESSIV`),
an authenticated encryption whose associated data binds the grant to its path and expiry: altered, made for
another path or expiry, or made with another fleet's key, it does not open. AES-SIV is deterministic (no
nonce): the same identity, path and expiry give the same grant, so the documents rendered for one client
change once per expiry step, as before, and equal grants tell only that they are equal. The key is derived
from the grants' key, itself derived from the metadata secret: every replica of the fleet opens every grant.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from proxy.identity.tokens import Grants

_KEY_LABEL = b"registry-proxy grant identities aes-siv v1"


class GrantCipher:
    """Seals and opens a grant's identity under a key derived from the grants' key (AES-256-SIV)."""

    def __init__(self, grant_key: bytes) -> None:
        self._aead = AESSIV(hmac.new(grant_key, _KEY_LABEL, hashlib.sha512).digest())

    def seal(self, plaintext: bytes, context: Sequence[bytes]) -> bytes:
        """`plaintext` encrypted and authenticated together with `context` (which is not in the result)."""
        return self._aead.encrypt(plaintext, list(context))

    def open(self, sealed: bytes, context: Sequence[bytes]) -> bytes | None:
        """The plaintext, or None when `sealed` was altered, or sealed with another key or `context`."""
        try:
            return self._aead.decrypt(sealed, list(context))
        except (InvalidTag, ValueError):
            return None


def create_grants(key: bytes) -> Grants:
    """The grants of a fleet whose grants' key is `key` (`proxy.identity.tokens.grant_key` of its secret)."""
    return Grants(key, GrantCipher(key))
