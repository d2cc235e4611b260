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

CI jobs may sign in with an OIDC workload token instead (`proxy.identity.issuers`, `proxy.identity.oidc`): such a client
is an `OidcClient`, whose scope is that of the issuer's rules its claims match. Both kinds of client have an
`Identity` (for logs and the audit trail: never the token) and share one `Scope` type, so a new permission is
added once for both. A grant made for an OIDC client is bound to its identity (issuer, subject and the claims
that granted access), which it carries encrypted (`proxy.identity.grant_cipher`: nothing of it is readable in
the URL), and dies no later than its token's `exp`.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import json
import re
import secrets
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from proxy.errors import GrantExpiredError, GrantInvalidError, GrantRevokedError

HASH_PREFIX = "sha256:"
_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}\Z")
SCOPE_KEYS = frozenset({"hosts", "namespaces", "lock", "metrics"})  # of a token and of an OIDC rule
_FLAGS = ("lock", "metrics")
_KEYS = frozenset({"hash", "admin"}) | SCOPE_KEYS  # `admin` (purging): static tokens only
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
ISSUER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # an OIDC issuer's name in the issuers file (and its grants)
_GRANT_PAYLOAD = re.compile(r"^[A-Za-z0-9_-]{1,12000}\Z")  # claims: a token fits in an 8 KiB header
# What a glob may hold: the characters of what it matches, and `*`, `?`, `[...]` (`[!...]`).
_HOST_GLOB = re.compile(r"^[a-z0-9.:\-*?\[\]!]+\Z")
_NAMESPACE_GLOB = re.compile(r"^[a-z0-9_\-*?\[\]!]+\Z")


class AuthConfigError(ValueError):
    """The tokens file is malformed."""


def new_token() -> str:
    """A fresh random token (256 bits), URL-safe."""
    return "rpt_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """`sha256:<hex>`: what the tokens file stores."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Scope:
    """What a client may do: read upstream `hosts` (globs), only `namespaces` of them (globs; None: all), call
    `/lock/v1`, read `/metrics`, purge what it may read (`admin`: a static token's only). The keys of a token's
    entry and of an OIDC rule (`SCOPE_KEYS`)."""

    hosts: tuple[str, ...] = ()
    namespaces: tuple[str, ...] | None = None
    lock: bool = False
    metrics: bool = False
    admin: bool = False

    def may_read(self, host: str, namespace: str | None = None) -> bool:
        """May read upstream `host` (and `namespace`, when the request names one)."""
        if not any(fnmatch.fnmatchcase(host, pattern) for pattern in self.hosts):
            return False
        if namespace is None or self.namespaces is None:
            return True
        return any(fnmatch.fnmatchcase(namespace.lower(), pattern) for pattern in self.namespaces)

    def texts(self) -> tuple[str, ...]:
        """The scope as `HOST/NAMESPACE` texts (`HOST/*`: every namespace), for the policy's `scopes` globs."""
        namespaces = self.namespaces if self.namespaces is not None else ("*",)
        return tuple(f"{host}/{namespace}" for host in self.hosts for namespace in namespaces)


def _toml_key_named(key: str) -> str:
    return f"`{key}`"


def parse_scope(
    where: str,
    entry: Mapping[str, Any],
    flags_read: tuple[str, ...] = _FLAGS,
    named: Callable[[str], str] = _toml_key_named,
) -> Scope:
    """The scope keys of a token's entry or an OIDC rule (`where` names it in errors, and each key as `named`
    writes it: `hosts` in a file, --hosts on a command line); AuthConfigError."""
    hosts = _patterns(where, "hosts", entry.get("hosts"), _HOST_GLOB, named)
    namespaces = (
        None
        if "namespaces" not in entry
        else _patterns(where, "namespaces", entry["namespaces"], _NAMESPACE_GLOB, named)
    )
    flags = {key: entry.get(key, False) for key in flags_read}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise AuthConfigError(f"{where}: `{key}` must be true or false")
    return Scope(hosts, namespaces, **flags)


def check_glob(pattern: str) -> str | None:
    """Why `pattern` is not a usable glob (an unclosed or empty `[...]`), or None."""
    index = 0
    while index < len(pattern):
        if pattern[index] == "[":
            end = pattern.find("]", index + 2 if pattern[index + 1 : index + 2] in ("!", "]") else index + 1)
            if end == -1:
                return f"{pattern!r} opens a `[` it does not close"
            if end == index + 1 or (end == index + 2 and pattern[index + 1] == "!"):
                return f"{pattern!r} has an empty `[]`"
            index = end
        index += 1
    return None


@dataclass(frozen=True)
class Identity:
    """Who a client is, for the logs and the audit trail (never its token): a static token by its name, an
    OIDC client by its token's subject, its issuer's name, and the claims and rules that granted it access."""

    kind: str  # "static" or "oidc"
    name: str  # the token's name, or the OIDC token's subject (`sub`)
    issuer: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)
    rules: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """The identity as log fields."""
        if self.kind == "static":
            return {"kind": "static", "name": self.name}
        return {
            "kind": "oidc",
            "subject": self.name,
            "issuer": self.issuer,
            "claims": dict(self.claims),
            "rules": list(self.rules),
        }


@dataclass(frozen=True)
class Token:
    """A named client token (its hash only) and what it may do."""

    name: str
    digest: bytes
    scope: Scope
    expires = None  # a static token lives until it is removed from the tokens file

    @cached_property
    def scope_texts(self) -> tuple[str, ...]:
        """Its scope as `HOST/NAMESPACE` texts (`Scope.texts`), computed once per token."""
        return self.scope.texts()

    @property
    def identity(self) -> Identity:
        return Identity("static", self.name)

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.scope.hosts

    @property
    def namespaces(self) -> tuple[str, ...] | None:
        return self.scope.namespaces

    @property
    def lock(self) -> bool:
        return self.scope.lock

    @property
    def metrics(self) -> bool:
        return self.scope.metrics

    def may_read(self, host: str, namespace: str | None = None) -> bool:
        """May read upstream `host` (and `namespace`, when the request names one)."""
        return self.scope.may_read(host, namespace)

    def may_lock(self, host: str, namespace: str | None = None) -> bool:
        """May call `/lock/v1` for `host` (and `namespace`)."""
        return self.scope.lock and self.scope.may_read(host, namespace)

    def may_purge(self, host: str, namespace: str | None = None) -> bool:
        """May purge what is cached of `host` (and `namespace`): the `admin` scope."""
        return self.scope.admin and self.scope.may_read(host, namespace)


@dataclass(frozen=True)
class OidcClient:
    """A client signed in with a valid OIDC token: its identity, and the scopes of the issuer's rules its claims
    match (what any of them allows is allowed); it and its grants last until the token's `exp`."""

    identity: Identity
    scopes: tuple[Scope, ...]
    expires: int

    @property
    def name(self) -> str:
        return f"{self.identity.issuer}:{self.identity.name}"

    @property
    def metrics(self) -> bool:
        return any(scope.metrics for scope in self.scopes)

    @cached_property
    def scope_texts(self) -> tuple[str, ...]:
        """The scopes of the rules it matched as `HOST/NAMESPACE` texts (`Scope.texts`), without repeats."""
        return tuple(dict.fromkeys(text for scope in self.scopes for text in scope.texts()))

    def may_read(self, host: str, namespace: str | None = None) -> bool:
        return any(scope.may_read(host, namespace) for scope in self.scopes)

    def may_lock(self, host: str, namespace: str | None = None) -> bool:
        return any(scope.lock and scope.may_read(host, namespace) for scope in self.scopes)

    def may_purge(self, host: str, namespace: str | None = None) -> bool:
        return any(scope.admin and scope.may_read(host, namespace) for scope in self.scopes)


Client = Token | OidcClient
# Re-evaluates a grant's OIDC identity against the issuers in force: (issuer, subject, claims, expires) → client.
OidcHolders = Callable[[str, str, Mapping[str, Any], int], OidcClient | None]


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
    scope = parse_scope(f"token {name!r}", entry, (*_FLAGS, "admin"))
    return Token(name, bytes.fromhex(stored[len(HASH_PREFIX) :]), scope)


def _patterns(
    where: str, key: str, value: object, allowed: re.Pattern[str], named: Callable[[str], str] = _toml_key_named
) -> tuple[str, ...]:
    """The names or globs of list `key`; AuthConfigError names `where` and the key as `named` writes it."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise AuthConfigError(f"{where}: `{key}` must be a list of names or globs")
    patterns = tuple(item.strip().lower() for item in value)
    for pattern in patterns:
        problem = check_glob(pattern)
        if problem is None and not allowed.match(pattern):
            problem = f"{pattern!r} holds characters no {key[:-1]} has{_PATTERN_HINTS[key] if '/' in pattern else ''}"
        if problem is not None:
            raise AuthConfigError(f"{where}: {named(key)}: {problem}")
    return patterns


_PATTERN_HINTS = {  # what was meant by a pattern with a `/`
    "hosts": " (a hostname or glob, not a URL: registry.terraform.io, *.corp.example)",
    "namespaces": " (a namespace alone: `acme` covers acme/*)",
}


def token_entry(
    name: str,
    token: str,
    hosts: list[str],
    namespaces: list[str] | None = None,
    lock: bool = False,
    metrics: bool = False,
    admin: bool = False,
) -> str:
    """The TOML entry for `token` to add to the tokens file: its hosts and namespaces read by the parser of the
    tokens file (`parse_scope`), so that an entry `serve` would refuse is never printed (AuthConfigError naming
    the option, --hosts or --namespaces)."""
    if not _NAME.match(name):
        raise AuthConfigError(f"token name {name[:70]!r}: use 1-64 letters, digits, '_', '-', '.', '@'")
    given = {"hosts": hosts} if namespaces is None else {"hosts": hosts, "namespaces": namespaces}
    scope = parse_scope("token new", given, (), named=lambda key: f"--{key}")
    lines = [
        f"[tokens.{_toml_key(name)}]",
        f'hash = "{hash_token(token)}"',
        f"hosts = [{', '.join(_toml_string(h) for h in scope.hosts)}]",
    ]
    if scope.namespaces is not None:
        lines.append(f"namespaces = [{', '.join(_toml_string(n) for n in scope.namespaces)}]")
    lines += [f"lock = {str(lock).lower()}", f"metrics = {str(metrics).lower()}"]
    if admin:
        lines.append("admin = true")
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


class IdentityCipher(Protocol):
    """Authenticated encryption of a grant's identity, bound to a context (`proxy.identity.grant_cipher`)."""

    def seal(self, plaintext: bytes, context: Sequence[bytes]) -> bytes: ...

    def open(self, sealed: bytes, context: Sequence[bytes]) -> bytes | None: ...


class Grants:
    """Signed, expiring permissions to download exactly one URL path, made for one client: put into the URLs
    of archives, SHA256SUMS and module packages in the documents served to a client that showed its token
    (`sign`), checked when a client without a token asks for that path (`holder`). Keyed by a secret that
    every replica shares, so any replica honours them.

    For a static token a grant is `EXPIRES.TOKENID.MAC`: the HMAC binds the path, the token's hash and the
    expiry, so it opens nothing else, dies with its token (removed from the tokens file, or given a new hash)
    and expires after `GRANT_LIFETIME`; TOKENID is an HMAC of the token's hash, which names no one. For an OIDC
    client it is `EXPIRES.SEALED`: SEALED is the issuer's name, the subject and the claims that granted access,
    encrypted by `cipher` (base64url) with the path and the expiry bound to it, which is no later than the
    token's `exp`; the issuer's rules in force decide again what those claims may read, so the grant dies with
    the issuer or the rules that granted it."""

    def __init__(self, key: bytes, cipher: IdentityCipher) -> None:
        self._key = key
        self._cipher = cipher

    def token_id(self, token: Token) -> str:
        """The token's name in its grants: not its hash, and not linkable to it without the key."""
        return hmac.new(self._key, b"grant token\0" + token.digest, hashlib.sha256).hexdigest()[:_TOKEN_ID_DIGITS]

    def holder_id(self, client: Client) -> str:
        """What a client's grants name it by (part of the key of the documents rendered for it)."""
        if isinstance(client, Token):
            return self.token_id(client)
        text = b"grant holder\0" + _identity_text(client.identity)
        return "oidc." + hmac.new(self._key, text, hashlib.sha256).hexdigest()[:32]

    @staticmethod
    def expiry(now: float, client: Client | None = None) -> int:
        """The expiry of a grant made now: `GRANT_LIFETIME` ahead, rounded up to `GRANT_STEP` (so the documents
        of one client change once a step, not per request); never after an OIDC client's token expires."""
        expires = -(-int(now + GRANT_LIFETIME) // GRANT_STEP) * GRANT_STEP
        return expires if client is None or client.expires is None else min(expires, client.expires)

    def sign(self, path: str, client: Client, expires: int) -> str:
        """A grant to GET `path` (the URL's path, percent-decoded, without its query) until `expires`."""
        if isinstance(client, Token):
            return f"{expires}.{self.token_id(client)}.{self._mac(path, client, expires)}"
        sealed = self._cipher.seal(_identity_text(client.identity), _oidc_context(path, expires))
        return f"{expires}.{base64.urlsafe_b64encode(sealed).decode().rstrip('=')}"

    def holder(
        self,
        path: str,
        grant: str,
        now: float,
        tokens: Mapping[str, Token],
        oidc: OidcHolders | None = None,
    ) -> Client:
        """The client `grant` was made for, when it allows `path` at `now`; `tokens` are the tokens in force by
        their `token_id`, `oidc` re-evaluates an OIDC identity against the issuers in force. Raises
        GrantInvalidError (malformed, forged, or made for another path), GrantRevokedError (its token, issuer
        or rule is gone) or GrantExpiredError."""
        parts = grant.split(".")
        if not (len(parts) in (2, 3) and parts[0].isdigit() and len(parts[0]) <= 12):
            raise GrantInvalidError("the grant in this URL is malformed")
        if len(parts) == 2:
            return self._oidc_holder(path, parts, now, oidc)
        expires_text, token_id, mac = parts
        if not _GRANT_ID.match(token_id):
            raise GrantInvalidError("the grant in this URL is malformed")
        token = tokens.get(token_id)
        if token is None:
            raise GrantRevokedError(
                "the grant in this URL was made for a client token this proxy does not have (removed or changed); "
                "ask for the document listing this URL again with a valid token"
            )
        if not hmac.compare_digest(mac.encode(), self._mac(path, token, int(expires_text)).encode()):
            raise GrantInvalidError("the grant in this URL was not made for it")
        _check_expiry(int(expires_text), now)
        return token

    def _oidc_holder(self, path: str, parts: list[str], now: float, oidc: OidcHolders | None) -> OidcClient:
        expires_text, payload = parts
        if not _GRANT_PAYLOAD.match(payload):
            raise GrantInvalidError("the grant in this URL is malformed")
        try:
            sealed = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        except (ValueError, binascii.Error):
            raise GrantInvalidError("the grant in this URL is malformed") from None
        opened = self._cipher.open(sealed, _oidc_context(path, int(expires_text)))
        if opened is None:  # altered, or made for another path or expiry, or by another fleet
            raise GrantInvalidError("the grant in this URL was not made for it")
        _check_expiry(int(expires_text), now)
        try:
            issuer, subject, claims = json.loads(opened)
        except (ValueError, TypeError):
            raise GrantInvalidError("the grant in this URL is malformed") from None
        if not (isinstance(issuer, str) and ISSUER_NAME.match(issuer)):
            raise GrantInvalidError("the grant in this URL is malformed")
        client = oidc(issuer, subject, claims, int(expires_text)) if oidc is not None else None
        if client is None:
            raise GrantRevokedError(
                f"the grant in this URL was made for an OIDC client of issuer {issuer!r}, which this proxy no "
                "longer trusts (removed from the issuers file); ask for the document listing this URL again"
            )
        return client

    def _mac(self, path: str, token: Token, expires: int) -> str:
        message = f"grant v2\0{path}\0{token.digest.hex()}\0{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:40]


def _identity_text(identity: Identity) -> bytes:
    """An OIDC identity in a grant (before it is sealed): its issuer's name, subject and the claims that granted
    access, as JSON."""
    document = [identity.issuer or "", identity.name, dict(identity.claims)]
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _oidc_context(path: str, expires: int) -> tuple[bytes, ...]:
    """What an OIDC grant's sealed identity is bound to: the grant's version, the path it opens, its expiry."""
    return (b"grant oidc v2", path.encode("utf-8", "surrogatepass"), str(expires).encode())


def _check_expiry(expires: int, now: float) -> None:
    if expires < now:
        raise GrantExpiredError("the grant in this URL has expired; ask for the document listing this URL again")


def grant_key(secret: bytes) -> bytes:
    """The grants' key, derived from the metadata secret (the same on every replica)."""
    return hmac.new(secret, b"registry-proxy archive grants v1", hashlib.sha256).digest()


def with_grant(url: str, grant: str) -> str:
    """`url?grant=…` (a go-getter `//subdir` stays in the path, where the clients look for it)."""
    base, sep, query = url.partition("?")
    return f"{base}?{GRANT_PARAM}={grant}" + (f"&{query}" if sep else "")
