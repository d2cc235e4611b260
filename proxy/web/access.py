"""Access control: client tokens (`--auth-tokens`), OIDC workload tokens (`--oidc-issuers`), their scopes,
private upstream hosts, signed archive URLs.

Every route that names an upstream host (`/mirror/v1/H/…`, `/registry/H/…`, `/lock/v1/H/…`) is
checked before its handler runs, also when the answer would come from the cache, so what a
client may read depends only on its token, never on what another client fetched:

- with a tokens file or an issuers file: no or an unknown token is `401` with `WWW-Authenticate: Bearer`
  (an OIDC token refused: `401` saying why, in the answer and in `auth.refused`); a token whose scope lacks
  the host (or namespace, or `/lock/v1`) is `403`. A bearer token that is none of the static tokens and
  looks like a JWT is checked as an OIDC token (`proxy.identity.oidc`);
- a host the proxy has upstream credentials for is private: anonymous access to it is always `403`, the
  answer for a host the proxy does not serve (it does not confirm that the private host exists);
- archives, SHA256SUMS and module archives are also served to a request carrying a valid grant
  (`proxy.identity.tokens.Grants`), which the proxy puts into the URLs of the documents it serves to an
  authorised client (`url_signer`), because the clients send no token when they download those: a
  grant opens the one URL it is in, only while the token it was made for is in force and may read
  the host and namespace, for `GRANT_LIFETIME`.

`/healthz`, `/readyz`, `/ca.pem` and the discovery document stay open; `/metrics` needs a token with
`metrics = true` under `--metrics-token-required`; the page at `/` needs any valid token. What the proxy
lists of itself shows only what the client may read: the page lists the hosts (their upstream URL,
discovery time, `host` blocks) and archives of the token's scope, `/metrics` names a private host (in its
`host` labels) only to a token that may read it, and without client tokens neither names a private host
(`readable`, `shown_host`). The tokens and issuers files are read again on SIGHUP.
Tokens are never logged: a request's client is logged by its `Identity` (a static token's name; an OIDC
token's issuer, subject and the claims that granted access), in the access log and in `auth.refused`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web
from yarl import URL

from proxy.domain.addresses import AddressError, Hostname
from proxy.domain.credentials import on_behalf_of
from proxy.errors import (
    GrantInvalidError,
    GrantRevokedError,
    HostNotAllowedError,
    OidcAlgorithmRefusedError,
    OidcAudienceError,
    OidcClaimsInvalidError,
    OidcIssuerUnavailableError,
    OidcIssuerUnknownError,
    OidcKeyUnknownError,
    OidcSignatureInvalidError,
    OidcTokenExpiredError,
    OidcTokenInvalidError,
    OidcTokenMalformedError,
    OidcTokenNotYetValidError,
    ProxyError,
    TokenInvalidError,
    TokenRequiredError,
    TokenScopeError,
)
from proxy.identity.issuers import IssuerBook, parse_issuers
from proxy.identity.jose import looks_like_jwt
from proxy.identity.oidc import OidcAuthenticator, TokenRefusedError
from proxy.identity.tokens import GRANT_PARAM, Client, Grants, TokenBook, bearer_token, parse_tokens, with_grant
from proxy.settings.config import Settings

log = structlog.get_logger("proxy.identity.tokens")

OPEN_ROUTES = frozenset({"healthz", "readyz", "discovery", "ca_pem"})  # the CA certificate is public
GRANTABLE_ROUTES = frozenset({"mirror_archive", "registry_provider_shasums", "registry_module_archive"})
REALM = "registry-proxy"


# The error of each reason an OIDC token is refused for (`proxy.identity.jose.JwtError.reason`, `proxy.identity.oidc`).
OIDC_REFUSALS: dict[str, type[OidcTokenInvalidError]] = {
    "malformed": OidcTokenMalformedError,
    "missing_claim": OidcClaimsInvalidError,
    "bad_claim": OidcClaimsInvalidError,
    "unknown_issuer": OidcIssuerUnknownError,
    "wrong_issuer": OidcIssuerUnknownError,
    "wrong_audience": OidcAudienceError,
    "algorithm_refused": OidcAlgorithmRefusedError,
    "unknown_key": OidcKeyUnknownError,
    "bad_signature": OidcSignatureInvalidError,
    "expired": OidcTokenExpiredError,
    "not_yet_valid": OidcTokenNotYetValidError,
}


# A refusal kept until the route shows it needs a client: an OIDC token refused, or its issuer's keys unavailable.
Problem = TokenRefusedError | OidcIssuerUnavailableError


class Access:
    """The tokens and OIDC issuers in force (each replaced whole on reload, and with them the clients grants may
    name), the private hosts, and the grant signer. `oidc` (the OIDC token checker) is set once its resources
    are open (`proxy.web.app`). `accepted`: the grants of the secrets accepted for reading during a rotation
    (`--metadata-secret-accepted`): grants they made are honoured, none is made with them."""

    def __init__(self, settings: Settings, grants: Grants, accepted: tuple[Grants, ...] = ()) -> None:
        self.path: Path | None = settings.access.auth_tokens
        self.issuers_path: Path | None = settings.access.oidc_issuers
        self.private = settings.upstreams.upstream_credentials.private_hosts
        self.metrics_token_required = settings.access.metrics_token_required
        self.grants = grants
        self._accepted = accepted
        self._use(load_tokens(self.path) if self.path is not None else TokenBook())
        self.issuers = load_issuers(self.issuers_path) if self.issuers_path is not None else IssuerBook()
        self.oidc: OidcAuthenticator | None = None
        self.required = settings.access.clients_required  # every request naming an upstream needs a client
        # Anything to check at all: without tokens, private hosts or a metrics token every request passes as is
        # (and no request pays for parsing its host here).
        self.active = self.required or bool(self.private) or self.metrics_token_required

    def reload(self) -> None:
        """Read the tokens and issuers files again; a broken file keeps what it gave in force (and says why)."""
        if self.path is not None:
            try:
                book = load_tokens(self.path)
            except (OSError, ValueError) as exc:  # AuthConfigError, or a file that is not UTF-8
                _reload_failed("auth.reload_failed", self.path, exc, "the previous tokens stay")
            else:
                self._use(book)
                log.info("auth.reloaded", file=str(self.path), tokens=len(self.book.tokens), pid=os.getpid())
        if self.issuers_path is not None:
            try:
                issuers = load_issuers(self.issuers_path)
            except (OSError, ValueError) as exc:
                _reload_failed("oidc.reload_failed", self.issuers_path, exc, "the previous issuers and rules stay")
            else:
                self.issuers = issuers
                log.info(
                    "oidc.reloaded",
                    file=str(self.issuers_path),
                    issuers=[issuer.name for issuer in issuers.issuers],
                    pid=os.getpid(),
                )

    async def authenticate(self, presented: str | None) -> tuple[Client | None, Problem | None]:
        """The client `presented` signs in (None: anonymous, or refused, with the problem when it is an OIDC
        token's: kept until the route shows it needs a client)."""
        if presented is None:
            return None, None
        token = self.book.authenticate(presented)
        if token is not None or self.oidc is None or not self.issuers.enabled or not looks_like_jwt(presented):
            return token, None
        try:
            return await self.oidc.authenticate(presented, self.issuers), None
        except (TokenRefusedError, OidcIssuerUnavailableError) as exc:
            return None, exc

    def _use(self, book: TokenBook) -> None:
        """Put `book` in force: its tokens, and the grants made for them (a grant of a token not in it is refused)."""
        self.book = book
        self._grant_holders = [
            (grants, {grants.token_id(token): token for token in book.tokens})
            for grants in (self.grants, *self._accepted)
        ]

    def grant_holder(self, path: str, grant: str, now: float) -> Client:
        """The client in force that `grant` was made for, if it allows `path` now (else a 401 is raised): made with
        the secret in force, or with one accepted during a rotation (the first key's refusal is the one raised)."""
        refused: GrantInvalidError | GrantRevokedError | None = None
        for grants, holders in self._grant_holders:
            try:
                return grants.holder(path, grant, now, holders, self.issuers.grant_holder)
            except (GrantInvalidError, GrantRevokedError) as exc:  # perhaps made with another key: try the next
                refused = refused or exc
        assert refused is not None
        raise refused


def _reload_failed(event: str, path: Path, exc: Exception, effect: str) -> None:
    log.error(event, file=str(path), error=str(exc), effect=effect, pid=os.getpid())


def load_tokens(path: Path) -> TokenBook:
    """The tokens file, parsed (raises OSError or AuthConfigError)."""
    return parse_tokens(path.read_text(encoding="utf-8"))


def load_issuers(path: Path) -> IssuerBook:
    """The issuers file, parsed (raises OSError or IssuersConfigError, an AuthConfigError)."""
    return parse_issuers(path.read_text(encoding="utf-8"))


ACCESS = web.AppKey("access", Access)
CLIENT = web.RequestKey("client", Client)


@web.middleware
async def access_control(request: web.Request, handler) -> web.StreamResponse:
    """Authenticate and authorise the request (refusals are errors of `proxy.errors`: 401, 403); fetches it
    causes act for the host it names."""
    access = request.app.get(ACCESS)
    if access is None or not access.active:  # nothing to check (the route is not even looked at)
        return await handler(request)
    route = request.match_info.route.name
    if route is None or route in OPEN_ROUTES:
        return await handler(request)
    presented = bearer_token(request.headers.get("Authorization"))
    client, problem = await access.authenticate(presented)
    if client is not None:
        request[CLIENT] = client
    if route == "metrics":  # shows a private host's series only to a token that may read the host
        _check_metrics(access, client, presented, problem)
    elif route in ("page", "catalog", "catalog_purge"):  # any valid token; each shows or purges what it may read
        if access.required and client is None:
            raise _unauthorized(request.path, presented, problem)
    else:
        info = request.match_info
        try:
            host = str(Hostname.parse(info["hostname"])) if "hostname" in info else None
        except AddressError:
            return await handler(request)  # the handler answers 400 for the malformed address
        if host is None:
            return await handler(request)
        _check_route(request, access, route, host, info.get("namespace"), client, presented, problem)
        with on_behalf_of(host):
            return await handler(request)
    return await handler(request)


def readable(request: web.Request) -> Callable[[str, str | None], bool]:
    """Which upstream hosts (and namespaces, when named) this request may see listed: the page's hosts and
    inventory. A token's scope; anonymous clients (only without client tokens) every host but the private."""
    access = request.app.get(ACCESS)
    client = request.get(CLIENT)
    if client is not None:
        return client.may_read
    private = access.private if access is not None else frozenset()
    return lambda host, namespace=None: host not in private


def shown_host(request: web.Request) -> Callable[[str], bool] | None:
    """Which hosts this request may see named in /metrics: every public host, and a private one only with a
    token that may read it (None: no private hosts, nothing to hide)."""
    access = request.app.get(ACCESS)
    if access is None or not access.private:
        return None
    client = request.get(CLIENT)
    private = access.private
    return lambda host: host not in private or (client is not None and client.may_read(host))


def _check_metrics(access: Access, client: Client | None, presented: str | None, problem: Problem | None) -> None:
    if not access.metrics_token_required:
        return
    if client is None:
        raise _unauthorized("/metrics", presented, problem)
    if not client.metrics:
        raise _forbidden(client, "/metrics", "this token may not read /metrics")


def _check_route(
    request: web.Request,
    access: Access,
    route: str,
    host: str,
    namespace: str | None,
    client: Client | None,
    presented: str | None,
    problem: Problem | None,
) -> None:
    """Raise the refusal of a request naming upstream `host` (and `namespace`), if it is refused."""
    if access.required:
        grant = request.query.get(GRANT_PARAM)
        if client is None and grant is not None and route in GRANTABLE_ROUTES:
            holder = access.grant_holder(request.path, grant, time.time())
            if not holder.may_read(host, namespace):
                raise _forbidden(holder, host, f"the token this URL's grant was made for may not read {host} now")
            request[CLIENT] = holder  # who downloads it, for the log
            return
    if may_read(access, client, host, namespace):
        if route == "lock" and client is not None and not client.may_lock(host, namespace):
            raise _forbidden(client, host, "this token may not call /lock/v1")
        return
    if not access.required:  # a private host: answered as a host the proxy does not serve, which does not confirm it
        log.info("auth.refused", host=host, reason="private host, no client tokens configured")
        raise HostNotAllowedError.for_host(host)
    if client is None:
        raise _unauthorized(host, presented, problem)
    raise _forbidden(
        client,
        host,
        f"this token may not read {host}" + (f"/{namespace}" if namespace and client.may_read(host) else ""),
    )


def may_read(access: Access, client: Client | None, host: str, namespace: str | None) -> bool:
    """Whether `client` (None: anonymous) may read upstream `host` (and `namespace`) through a route naming it:
    with client tokens, a token whose scope holds it; without them, any host but a private one. (A grant, and
    `/lock/v1`'s own permission, are `_check_route`'s.)"""
    if access.required:
        return client is not None and client.may_read(host, namespace)
    return host not in access.private


def quietly_admitted(access: Access, authorization: str | None, hostname: str, namespace: str) -> Client | bool:
    """For a route naming upstream `hostname` that takes no grant: the static token's client a request with this
    `Authorization` header is let in as (True: let in without one), or False when it would be refused or needs more
    than a look (an unknown or OIDC token, a malformed host). Nothing is logged: on False, `access_control` decides
    (and logs a refusal)."""
    presented = bearer_token(authorization)
    client = access.book.authenticate(presented) if presented is not None else None
    if presented is not None and client is None:
        return False
    try:
        host = str(Hostname.parse(hostname))
    except AddressError:
        return False
    if not may_read(access, client, host, namespace):
        return False
    return client if client is not None else True


def _unauthorized(what: str, presented: str | None, problem: Problem | None = None) -> ProxyError:
    challenge = f'Bearer realm="{REALM}"' + (', error="invalid_token"' if presented is not None else "")
    if isinstance(problem, OidcIssuerUnavailableError):
        log.info("auth.refused", what=what, reason="oidc issuer unavailable", detail=problem.message)
        return problem
    if problem is not None:
        log.info(
            "auth.refused",
            what=what,
            reason=f"oidc {problem.reason}",
            detail=problem.message,
            issuer=problem.issuer,
            subject=problem.subject,
        )
        error = OIDC_REFUSALS.get(problem.reason, OidcTokenInvalidError)
        return error(f"{what}: the OIDC token was refused: {problem.message}", headers={"WWW-Authenticate": challenge})
    reason = "unknown token" if presented is not None else "no token"
    log.info("auth.refused", what=what, reason=reason)
    error = TokenInvalidError if presented is not None else TokenRequiredError
    return error(
        f"{what}: a client token is required ({reason}); send "
        "`Authorization: Bearer TOKEN` (a credentials block or TF_TOKEN_<host> in the CLI)",
        headers={"WWW-Authenticate": challenge},
    )


def _forbidden(client: Client, what: str, message: str) -> TokenScopeError:
    log.info("auth.refused", token=client.name, client=client.identity.fields(), what=what, reason=message)
    return TokenScopeError(message)


@dataclass(frozen=True)
class UrlSigner:
    """Puts grants into the URLs of one request's document: each for exactly the path the URL names (resolved
    against the request's own URL, as the client resolves it), for the request's token, with one expiry."""

    grants: Grants
    token: Client
    expires: int
    base: URL  # the request's URL, which relative URLs resolve against

    @property
    def key(self) -> tuple:
        """What the signed URLs depend on besides the document: part of its rendered answer's key."""
        return (self.grants.holder_id(self.token), self.expires, self.base.path)

    def sign(self, url: str) -> str:
        """`url` (relative, or root-relative) with the grant for its path; a go-getter `//subdir` and the query
        are not part of the path the client requests."""
        location = url.partition("?")[0]
        path = self.base.join(URL(location.partition("//")[0] if location.startswith("/") else location)).path
        return with_grant(url, self.grants.sign(path, self.token, self.expires))


def url_signer(request: web.Request) -> UrlSigner | None:
    """The signer of this request's document URLs (None for anonymous requests, whose documents stay as they
    are)."""
    client = request.get(CLIENT)
    if client is None:
        return None
    return signer_for(request.app[ACCESS].grants, client, request.rel_url)


def signer_for(grants: Grants, client: Client, base: URL) -> UrlSigner:
    """The signer of the URLs of a document for `client`, answering a request for `base` (its URL)."""
    return UrlSigner(grants, client, Grants.expiry(time.time(), client), base)
