"""The OIDC issuers file (`--oidc-issuers`): which issuers' workload tokens sign a client in, and what their
claims may read. Pure: text in, decisions out (the tokens themselves are checked by `proxy.identity.oidc`).

The file is TOML, one table per issuer, each with rules that map claims to the scope keys of a client
token (`proxy.identity.tokens.SCOPE_KEYS`):

    [issuers.github]                                     # its name: in logs, metrics and grants
    url = "https://token.actions.githubusercontent.com"  # the tokens' `iss`, exactly
    audiences = ["https://proxy.example.com"]            # `aud` must name one of them
    algorithms = ["RS256"]                               # default; RS*, PS*, ES*, EdDSA/Ed25519 only
    leeway = "30s"                                       # clock skew allowed on exp, nbf, iat (at most 5m)
    # jwks_url = "https://…"                             # the keys without discovery (another host, say)

    [[issuers.github.rules]]
    name = "acme"                                        # optional: in logs and metrics
    claims = { repository_owner = "acme" }               # every claim named must match one of its globs
    hosts = ["registry.terraform.io"]
    namespaces = ["acme", "hashicorp"]
    lock = true

A rule's claim is a top-level claim, or a path into nested claims (`"kubernetes.io/namespace"`); a claim
holding a list matches when one of its items does. Globs are case-sensitive, like the claims. A valid token
whose claims match no rule signs a client in that may read nothing (403).
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proxy.identity.tokens import (
    ISSUER_NAME,
    SCOPE_KEYS,
    AuthConfigError,
    Identity,
    OidcClient,
    Scope,
    check_glob,
    parse_scope,
)
from proxy.settings.values import ConfigError, parse_duration

# Asymmetric signatures only: never `none`, never an HMAC (whose key would be the issuer's public key).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA", "Ed25519")
DEFAULT_ALGORITHMS = ("RS256",)  # what GitHub Actions, GitLab and Kubernetes sign with
DEFAULT_LEEWAY = 30.0
MAX_LEEWAY = 300.0
_ISSUER_KEYS = frozenset({"url", "audiences", "algorithms", "leeway", "jwks_url", "rules"})
_RULE_KEYS = frozenset({"name", "claims"}) | SCOPE_KEYS
_MAX_CLAIM_TEXT = 1024  # a glob, or a claim's value, longer than this is not a name anyone grants by


class IssuersConfigError(AuthConfigError):
    """The issuers file is malformed (the message names the issuer and the key)."""


@dataclass(frozen=True)
class ClaimRule:
    """Claims to match (each a claim name or path, and the globs one of which its value must match), and the
    scope they grant."""

    name: str
    claims: tuple[tuple[str, tuple[str, ...]], ...]
    scope: Scope

    def granting(self, claims: Mapping[str, Any]) -> dict[str, Any] | None:
        """The claims of a token that satisfy this rule (a list claim: its items that match), or None."""
        found = {}
        for path, globs in self.claims:
            value = claim_value(claims, path)
            matching = [text for text in _texts(value) if any(_glob_match(text, glob) for glob in globs)]
            if not matching:
                return None
            found[path] = matching if isinstance(value, list) else value
        return found


@dataclass(frozen=True)
class Issuer:
    """One trusted issuer: where its keys are, what its tokens must say, and its rules."""

    name: str
    url: str
    audiences: tuple[str, ...]
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    leeway: float = DEFAULT_LEEWAY
    jwks_url: str | None = None
    rules: tuple[ClaimRule, ...] = ()

    @property
    def discovery_url(self) -> str:
        return self.url.rstrip("/") + "/.well-known/openid-configuration"

    def client(self, subject: str, claims: Mapping[str, Any], expires: int) -> OidcClient:
        """The client a valid token with these claims signs in: the scopes of every rule its claims match, and
        the claims and rules that granted them (none match: a client that may read nothing)."""
        scopes, granted, rules = [], {}, []
        for rule in self.rules:
            found = rule.granting(claims)
            if found is not None:
                scopes.append(rule.scope)
                granted.update(found)
                rules.append(rule.name)
        return OidcClient(Identity("oidc", subject, self.name, granted, tuple(rules)), tuple(scopes), expires)


@dataclass(frozen=True)
class IssuerBook:
    """The configured issuers; `enabled` once an issuers file is given (even an empty one)."""

    issuers: tuple[Issuer, ...] = ()
    enabled: bool = False

    def by_url(self, url: str) -> Issuer | None:
        """The issuer whose tokens say `iss = url` (compared exactly, as OpenID Connect requires)."""
        return next((issuer for issuer in self.issuers if issuer.url == url), None)

    def grant_holder(self, issuer: str, subject: object, claims: object, expires: int) -> OidcClient | None:
        """The client a grant made for an OIDC identity stands for now: its claims judged by the issuer's rules
        in force (None when the issuer is gone, or no rule grants those claims anything any more)."""
        found = next((entry for entry in self.issuers if entry.name == issuer), None)
        if found is None or not isinstance(subject, str) or not isinstance(claims, dict):
            return None
        client = found.client(subject, claims, expires)
        return client if client.scopes else None


def claim_value(claims: Mapping[str, Any], path: str) -> Any:
    """A claim by name, or (when no claim has that name) by its path into nested claims: `a/b` is `claims[a][b]`."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _texts(value: Any) -> list[str]:
    """A claim's value as the texts globs are matched against (a list: each scalar item; JSON's spelling)."""
    if isinstance(value, list):
        return [text for item in value if not isinstance(item, list | dict) for text in _texts(item)]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, str | int | float):
        text = str(value)
        return [text] if len(text) <= _MAX_CLAIM_TEXT else []
    return []


def _glob_match(text: str, glob: str) -> bool:
    return fnmatch.fnmatchcase(text, glob)


def parse_issuers(text: str) -> IssuerBook:
    """The issuers file's content → IssuerBook, or IssuersConfigError naming the issuer and key at fault."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise IssuersConfigError(f"not valid TOML: {exc}") from None
    unknown = set(data) - {"issuers"}
    if unknown:
        raise IssuersConfigError(f"unknown top-level keys {sorted(unknown)}; expected [issuers.NAME] tables")
    table = data.get("issuers", {})
    if not isinstance(table, dict):
        raise IssuersConfigError("`issuers` must be a table of [issuers.NAME] entries")
    issuers = [_issuer(name, entry) for name, entry in table.items()]
    urls = [issuer.url for issuer in issuers]
    for issuer in issuers:
        if urls.count(issuer.url) > 1:
            raise IssuersConfigError(f"issuer {issuer.name!r}: `url` {issuer.url} is given to another issuer too")
    return IssuerBook(tuple(issuers), enabled=True)


def _issuer(name: str, entry: object) -> Issuer:
    if not ISSUER_NAME.match(name):
        raise IssuersConfigError(f"issuer name {name[:70]!r}: use 1-64 letters, digits, '_' or '-'")
    where = f"issuer {name!r}"
    if not isinstance(entry, dict):
        raise IssuersConfigError(f"{where}: expected a table")
    unknown = set(entry) - _ISSUER_KEYS
    if unknown:
        raise IssuersConfigError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_ISSUER_KEYS)})")
    url = _https_url(where, "url", entry.get("url"))
    jwks_url = _https_url(where, "jwks_url", entry["jwks_url"]) if "jwks_url" in entry else None
    audiences = entry.get("audiences")
    if isinstance(audiences, str):
        audiences = [audiences]
    if not (
        isinstance(audiences, list)
        and audiences
        and all(isinstance(item, str) and item.strip() == item and item for item in audiences)
    ):
        raise IssuersConfigError(
            f"{where}: `audiences` must list at least one audience (the `aud` its tokens are minted for, e.g. "
            "this proxy's URL)"
        )
    rules = entry.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(rule, dict) for rule in rules):
        raise IssuersConfigError(f"{where}: `rules` must be [[issuers.{name}.rules]] tables")
    parsed_rules = tuple(_rule(where, index, rule) for index, rule in enumerate(rules, 1))
    names = [rule.name for rule in parsed_rules]
    duplicate = next((rule for rule in names if names.count(rule) > 1), None)
    if duplicate is not None:
        raise IssuersConfigError(f"{where}: two rules are named {duplicate!r}")
    return Issuer(
        name,
        url,
        tuple(audiences),
        _algorithms(where, entry.get("algorithms", list(DEFAULT_ALGORITHMS))),
        _leeway(where, entry.get("leeway", DEFAULT_LEEWAY)),
        jwks_url,
        parsed_rules,
    )


def _https_url(where: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise IssuersConfigError(f"{where}: `{key}` must be an https:// URL")
    parts = urlsplit(value)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.password or parts.query:
        raise IssuersConfigError(f"{where}: `{key}` must be an https:// URL without credentials or query: {value!r}")
    if parts.fragment:
        raise IssuersConfigError(f"{where}: `{key}` must not have a fragment: {value!r}")
    return value


def _algorithms(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise IssuersConfigError(f'{where}: `algorithms` must list signature algorithms, e.g. ["RS256"]')
    for algorithm in value:
        if algorithm.lower() == "none" or algorithm.upper().startswith("HS"):
            raise IssuersConfigError(
                f"{where}: `algorithms`: {algorithm!r} is never accepted (an unsigned token, or an HMAC that anyone "
                "holding the issuer's public key could compute)"
            )
        if algorithm not in ALGORITHMS:
            raise IssuersConfigError(f"{where}: `algorithms`: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    return tuple(dict.fromkeys(value))


def _leeway(where: str, value: object) -> float:
    try:
        seconds = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
        if seconds is None:
            seconds = parse_duration(str(value)) if isinstance(value, str) else -1.0
    except ConfigError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_LEEWAY:
        raise IssuersConfigError(f'{where}: `leeway` must be a duration from 0s to 5m (e.g. "30s"), not {value!r}')
    return seconds


def _rule(where: str, index: int, entry: dict) -> ClaimRule:
    name = entry.get("name", str(index))
    if not isinstance(name, str) or not ISSUER_NAME.match(name):
        raise IssuersConfigError(f"{where}: rule {index}: `name` must be 1-64 letters, digits, '_' or '-'")
    at = f"{where}, rule {name!r}"
    unknown = set(entry) - _RULE_KEYS
    if unknown:
        raise IssuersConfigError(f"{at}: unknown keys {sorted(unknown)} (known: {sorted(_RULE_KEYS)})")
    claims = entry.get("claims")
    if not isinstance(claims, dict) or not claims:
        raise IssuersConfigError(
            f'{at}: `claims` must name at least one claim to match, e.g. claims = {{ repository_owner = "acme" }}'
        )
    matchers = tuple((path, _claim_globs(at, path, value)) for path, value in claims.items())
    if all(glob == "*" for _, globs in matchers for glob in globs):
        raise IssuersConfigError(
            f'{at}: `claims` match anything (only "*"): name the owner, repository or subject the rule is for '
            "(an issuer such as GitHub's signs tokens for every repository in the world)"
        )
    try:
        scope = parse_scope(at, entry)
    except AuthConfigError as exc:
        raise IssuersConfigError(str(exc)) from None
    return ClaimRule(name, matchers, scope)


def _claim_globs(at: str, path: str, value: object) -> tuple[str, ...]:
    where = f"{at}: claim {path!r}"
    if not path or len(path) > 200 or not path.isprintable():
        raise IssuersConfigError(f"{at}: claim names must be 1-200 printable characters")
    globs = [value] if isinstance(value, str) else value
    if not isinstance(globs, list) or not globs or not all(isinstance(glob, str) for glob in globs):
        raise IssuersConfigError(f"{where}: give a glob or a list of globs (strings)")
    for glob in globs:
        if not glob or len(glob) > _MAX_CLAIM_TEXT or not glob.isprintable():
            raise IssuersConfigError(f"{where}: {glob[:70]!r} is not a glob (empty, too long or unprintable)")
        problem = check_glob(glob)
        if problem is not None:
            raise IssuersConfigError(f"{where}: {problem}")
    return tuple(globs)
