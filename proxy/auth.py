"""Client tokens, their scopes, and signed archive URLs. Pure: text in, decisions out.

The tokens file (`--auth-tokens`) is TOML, one table per named token; only a hash of each
token is stored (`registry-proxy token new NAME` makes a token and prints its entry):

    [tokens.ci]
    hash = "sha256:9f86d081…"            # SHA-256 of the token, hex
    hosts = ["registry.terraform.io", "*.corp.example"]   # upstream hosts it may read (globs)
    namespaces = ["hashicorp", "acme-*"]  # optional: only these namespaces (globs); default all
    lock = true                           # may call /lock/v1 (default false)
    metrics = false                       # may read /metrics when it needs a token (default false)

A presented token is hashed and compared with every stored hash in constant time
(`hmac.compare_digest`). The clients send tokens only with metadata requests, not when they
download the archives those documents list (Terraform's `installFromHTTPURL`, `getFile` and
go-getter send no credentials), so the proxy signs the archive URLs it hands to an
authorised client (`Grants`): a grant names the exact path (which carries the upstream host,
namespace, provider, version and platform), belongs to the token it was made for (and dies
with it), and expires after `GRANT_LIFETIME`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.errors import GrantExpiredError, GrantInvalidError, GrantRevokedError

HASH_PREFIX = "sha256:"
_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}\Z")
_KEYS = frozenset({"hash", "hosts", "namespaces", "lock", "metrics"})
GRANT_PARAM = "grant"
# How long a grant lives: the clients fetch what a document lists within milliseconds of its answer (Terraform
# 1.11, measured with bench/grant_window.py: at most 23 ms for an archive through the network mirror, 1.2 s
# through host blocks, where SHA256SUMS and its signature are fetched in between); OpenTofu's retries of a
# failed download (2, after 1 s and 2 s, each after a failed attempt) stay within a minute. Ten minutes is
# that with a wide margin (slow upstreams, long cold downloads before a retry, clock skew between replicas).
GRANT_LIFETIME = 600  # seconds
GRANT_STEP = 60  # expiries are rounded up to the minute: a grant lives GRANT_LIFETIME to GRANT_LIFETIME + 60 s
_TOKEN_ID_DIGITS = 16
_GRANT_ID = re.compile(rf"^[0-9a-f]{{{_TOKEN_ID_DIGITS}}}\Z")


class AuthConfigError(ValueError):
    """The tokens file is malformed."""


def new_token() -> str:
    """A fresh random token (256 bits), URL-safe."""
    return "rpt_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """`sha256:<hex>`: what the tokens file stores."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Token:
    """A named client token (its hash only) and what it may do."""

    name: str
    digest: bytes
    hosts: tuple[str, ...]
    namespaces: tuple[str, ...] | None = None
    lock: bool = False
    metrics: bool = False

    def may_read(self, host: str, namespace: str | None = None) -> bool:
        """May read upstream `host` (and `namespace`, when the request names one)."""
        if not any(fnmatch.fnmatchcase(host, pattern) for pattern in self.hosts):
            return False
        if namespace is None or self.namespaces is None:
            return True
        return any(fnmatch.fnmatchcase(namespace.lower(), pattern) for pattern in self.namespaces)


@dataclass(frozen=True)
class TokenBook:
    """The configured tokens; `enabled` once a tokens file is given (even an empty one)."""

    tokens: tuple[Token, ...] = ()
    enabled: bool = False

    def authenticate(self, presented: str) -> Token | None:
        """The token whose hash matches `presented`, compared in constant time against every entry."""
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for token in self.tokens:
            if hmac.compare_digest(digest, token.digest):
                found = token
        return found


def parse_tokens(text: str) -> TokenBook:
    """The tokens file's content → TokenBook, or AuthConfigError naming what is wrong (never a hash)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AuthConfigError(f"tokens file is not valid TOML: {exc}") from None
    unknown = set(data) - {"tokens"}
    if unknown:
        raise AuthConfigError(f"tokens file: unknown top-level keys {sorted(unknown)}; expected [tokens.NAME] tables")
    table = data.get("tokens", {})
    if not isinstance(table, dict):
        raise AuthConfigError("tokens file: `tokens` must be a table of [tokens.NAME] entries")
    tokens, seen = [], set()
    for name, entry in table.items():
        token = _token(name, entry)
        if token.digest in seen:
            raise AuthConfigError(f"token {name!r}: the same hash is listed twice")
        seen.add(token.digest)
        tokens.append(token)
    return TokenBook(tuple(tokens), enabled=True)


def _token(name: str, entry: object) -> Token:
    if not _NAME.match(name):
        raise AuthConfigError(f"token name {name[:70]!r}: use 1-64 letters, digits, '_', '-', '.', '@'")
    if not isinstance(entry, dict):
        raise AuthConfigError(f"token {name!r}: expected a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise AuthConfigError(f"token {name!r}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    stored = entry.get("hash")
    if (
        not isinstance(stored, str)
        or not stored.startswith(HASH_PREFIX)
        or not _HEX_SHA256.match(stored[len(HASH_PREFIX) :].lower())
    ):
        raise AuthConfigError(
            f'token {name!r}: `hash` must be "sha256:<64 hex digits>" (see `registry-proxy token new`)'
        )
    hosts = _patterns(name, "hosts", entry.get("hosts"))
    namespaces = None if "namespaces" not in entry else _patterns(name, "namespaces", entry["namespaces"])
    flags = {key: entry.get(key, False) for key in ("lock", "metrics")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise AuthConfigError(f"token {name!r}: `{key}` must be true or false")
    return Token(name, bytes.fromhex(stored[len(HASH_PREFIX) :]), hosts, namespaces, **flags)


def _patterns(name: str, key: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise AuthConfigError(f"token {name!r}: `{key}` must be a list of names or globs")
    return tuple(item.strip().lower() for item in value)


def token_entry(
    name: str,
    token: str,
    hosts: list[str],
    namespaces: list[str] | None = None,
    lock: bool = False,
    metrics: bool = False,
) -> str:
    """The TOML entry for `token` to add to the tokens file."""
    if not _NAME.match(name):
        raise AuthConfigError(f"token name {name[:70]!r}: use 1-64 letters, digits, '_', '-', '.', '@'")
    lines = [
        f"[tokens.{_toml_key(name)}]",
        f'hash = "{hash_token(token)}"',
        f"hosts = [{', '.join(_toml_string(h) for h in hosts)}]",
    ]
    if namespaces is not None:
        lines.append(f"namespaces = [{', '.join(_toml_string(n) for n in namespaces)}]")
    lines += [f"lock = {str(lock).lower()}", f"metrics = {str(metrics).lower()}"]
    return "\n".join(lines) + "\n"


def _toml_key(name: str) -> str:
    return name if re.match(r"^[A-Za-z0-9_-]+\Z", name) else _toml_string(name)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None if absent or another scheme)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


class Grants:
    """Signed, expiring permissions to download exactly one URL path, made for one client token: put into
    the URLs of archives, SHA256SUMS and module packages in the documents served to a client that showed
    the token (`sign`), checked when a client without a token asks for that path (`holder`). A grant is
    `EXPIRES.TOKENID.MAC`: the HMAC binds the path, the token's hash and the expiry, so it opens nothing
    else, dies with its token (removed from the tokens file, or given a new hash) and expires after
    `GRANT_LIFETIME`. Keyed by a secret that every replica shares, so any replica honours them."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def token_id(self, token: Token) -> str:
        """The token's name in its grants: not its hash, and not linkable to it without the key."""
        return hmac.new(self._key, b"grant token\0" + token.digest, hashlib.sha256).hexdigest()[:_TOKEN_ID_DIGITS]

    @staticmethod
    def expiry(now: float) -> int:
        """The expiry of a grant made now: `GRANT_LIFETIME` ahead, rounded up to `GRANT_STEP` (so the documents
        of one client change once a step, not per request)."""
        return -(-int(now + GRANT_LIFETIME) // GRANT_STEP) * GRANT_STEP

    def sign(self, path: str, token: Token, expires: int) -> str:
        """A grant to GET `path` (the URL's path, percent-decoded, without its query) until `expires`."""
        return f"{expires}.{self.token_id(token)}.{self._mac(path, token, expires)}"

    def holder(self, path: str, grant: str, now: float, tokens: Mapping[str, Token]) -> Token:
        """The token `grant` was made for, when it allows `path` at `now`; `tokens` are the tokens in force by
        their `token_id`. Raises GrantInvalidError (malformed, forged, or made for another path),
        GrantRevokedError (its token is gone) or GrantExpiredError."""
        parts = grant.split(".")
        if len(parts) != 3 or not (parts[0].isdigit() and len(parts[0]) <= 12 and _GRANT_ID.match(parts[1])):
            raise GrantInvalidError("the grant in this URL is malformed")
        expires_text, token_id, mac = parts
        token = tokens.get(token_id)
        if token is None:
            raise GrantRevokedError(
                "the grant in this URL was made for a client token this proxy does not have (removed or changed); "
                "ask for the document listing this URL again with a valid token"
            )
        if not hmac.compare_digest(mac.encode(), self._mac(path, token, int(expires_text)).encode()):
            raise GrantInvalidError("the grant in this URL was not made for it")
        if int(expires_text) < now:
            raise GrantExpiredError("the grant in this URL has expired; ask for the document listing this URL again")
        return token

    def _mac(self, path: str, token: Token, expires: int) -> str:
        message = f"grant v2\0{path}\0{token.digest.hex()}\0{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:40]


def grant_key(secret: bytes) -> bytes:
    """The grants' key, derived from the metadata secret (the same on every replica)."""
    return hmac.new(secret, b"registry-proxy archive grants v1", hashlib.sha256).digest()


def with_grant(url: str, grant: str) -> str:
    """`url?grant=…` (a go-getter `//subdir` stays in the path, where the clients look for it)."""
    base, sep, query = url.partition("?")
    return f"{base}?{GRANT_PARAM}={grant}" + (f"&{query}" if sep else "")
