"""The proxy's one error hierarchy: every refusal and failure a client sees is one of these.

Each class knows its HTTP status, a stable machine-readable code and whether it is expected (an
expected error is the client's or the world's doing, not logged as a failure). Handlers and the
access check raise them (or let them propagate); one middleware renders each as the protocols'
`{"errors": [message]}` with the code next to it, `{"errors": [message], "code": "..."}`, and the
error's headers (`WWW-Authenticate`, `Allow`, `Content-Range`). Codes are stable: clients and tests
match on them, and `code_table()` lists them for docs/errors.md. Nothing here imports aiohttp.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class ProxyError(Exception):
    """Base class: a failure with a user-facing message, an HTTP status and a code."""

    status: int = 500
    code: str = "internal_error"
    expected: bool = False

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})

    def document(self) -> dict:
        """The JSON body: the protocols' `errors` list, and the code next to it."""
        return {"errors": [self.message], "code": self.code}

    @property
    def reason_phrase(self) -> str | None:
        """The status line's reason phrase, when not the standard one for the status."""
        return None


class InternalError(ProxyError):
    """The proxy failed in a way it did not foresee (a bug): the log has the traceback under the request id."""

    code = "internal_error"


# ---- the request ------------------------------------------------------------------------------


class InvalidRequestError(ProxyError):
    """The client asked for something malformed (a bad query, an archive name that does not fit)."""

    status = 400
    code = "invalid_request"
    expected = True


class InvalidAddressError(InvalidRequestError):
    """A hostname, namespace, type, version or platform in the request does not parse."""

    code = "invalid_address"


class MalformedRequestError(InvalidRequestError):
    """The request is not valid HTTP (answered before the application sees it)."""

    code = "malformed_request"


class RequestLineTooLongError(InvalidRequestError):
    """The request line (method, target, version) is longer than the proxy reads."""

    status = 414
    code = "request_line_too_long"


class RequestHeadersTooLargeError(InvalidRequestError):
    """A header field, or the number of them, is beyond what the proxy reads."""

    status = 431
    code = "request_headers_too_large"


class RequestBodyTooLargeError(InvalidRequestError):
    """The request carries a body larger than the proxy reads."""

    status = 413
    code = "request_body_too_large"


class HttpVersionNotSupportedError(ProxyError):
    """The request's HTTP version is not 1.0 or 1.1."""

    status = 505
    code = "http_version_not_supported"
    expected = True


class MethodNotAllowedError(ProxyError):
    """The path exists, but not for this method (`Allow` names those it takes)."""

    status = 405
    code = "method_not_allowed"
    expected = True


class PreconditionFailedError(ProxyError):
    """`If-Match` names another version of the archive than the one served."""

    status = 412
    code = "precondition_failed"
    expected = True


class RangeNotSatisfiableError(ProxyError):
    """The `Range` asked for lies outside the archive (`Content-Range` gives its size)."""

    status = 416
    code = "range_not_satisfiable"
    expected = True


class HttpRefusalError(ProxyError):
    """Another HTTP refusal raised by the web framework itself (its status as aiohttp chose it)."""

    code = "http_refusal"
    expected = True

    def __init__(self, message: str, status: int, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.status = status


# ---- who may ask --------------------------------------------------------------------------------


class UnauthorizedError(ProxyError):
    """The request needs a client token (or a grant) and carries none that is valid (`WWW-Authenticate`)."""

    status = 401
    code = "unauthorized"
    expected = True


class TokenRequiredError(UnauthorizedError):
    """No client token was sent, and this proxy requires one."""

    code = "token_required"


class TokenInvalidError(UnauthorizedError):
    """The client token sent is not one of the proxy's tokens."""

    code = "token_invalid"


class OidcTokenInvalidError(TokenInvalidError):
    """An OIDC token was refused: from an issuer not configured, for another audience, signed with an algorithm
    or a key the issuer does not use, tampered with, or malformed (the message and the log say which)."""

    code = "oidc_token_invalid"


class OidcTokenExpiredError(OidcTokenInvalidError):
    """The OIDC token has expired: ask the CI system for a fresh one."""

    code = "oidc_token_expired"


class OidcTokenNotYetValidError(OidcTokenInvalidError):
    """The OIDC token is not valid yet (`nbf` or `iat` ahead of the proxy's clock beyond the leeway)."""

    code = "oidc_token_not_yet_valid"


class OidcTokenMalformedError(OidcTokenInvalidError):
    """The bearer token looks like a JWT but is not one (three base64url parts of JSON, a JSON object of claims)."""

    code = "oidc_token_malformed"


class OidcClaimsInvalidError(OidcTokenInvalidError):
    """The OIDC token lacks a claim the proxy needs (`iss`, `sub`, `aud`, `exp`) or holds one of the wrong type."""

    code = "oidc_claims_invalid"


class OidcIssuerUnknownError(OidcTokenInvalidError):
    """The OIDC token's issuer (`iss`) is none of the issuers in --oidc-issuers."""

    code = "oidc_issuer_unknown"


class OidcAudienceError(OidcTokenInvalidError):
    """The OIDC token was made for another audience (`aud`) than the issuer's `audiences` in --oidc-issuers:
    request it with this proxy's audience."""

    code = "oidc_wrong_audience"


class OidcAlgorithmRefusedError(OidcTokenInvalidError):
    """The OIDC token is signed with an algorithm its issuer's `algorithms` do not list (`none` and the HMAC
    algorithms never are)."""

    code = "oidc_algorithm_refused"


class OidcKeyUnknownError(OidcTokenInvalidError):
    """The OIDC token names a signing key (`kid`) its issuer does not publish (withdrawn, or made up)."""

    code = "oidc_key_unknown"


class OidcSignatureInvalidError(OidcTokenInvalidError):
    """The OIDC token's signature does not verify with its issuer's key (tampered with, or signed by another key)."""

    code = "oidc_signature_invalid"


class GrantInvalidError(UnauthorizedError):
    """The signed URL's grant is malformed, forged, or made for another URL."""

    code = "grant_invalid"


class GrantExpiredError(UnauthorizedError):
    """The signed URL's grant has expired: ask for the document listing the URL again."""

    code = "grant_expired"


class GrantRevokedError(UnauthorizedError):
    """The token the grant was made for has been removed from the tokens file (or changed)."""

    code = "grant_revoked"


class ForbiddenError(ProxyError):
    """The request is authenticated, but not allowed what it asks for."""

    status = 403
    code = "forbidden"
    expected = True


class TokenScopeError(ForbiddenError):
    """The client token (or the token a grant was made for) may not read this host or namespace, or may not
    call `/lock/v1` or read `/metrics`."""

    code = "token_scope"


class AdminScopeError(TokenScopeError):
    """Only a client token with `admin = true` may purge cached providers and modules (and with no tokens file
    there is none: purge with the `registry-proxy purge` command)."""

    code = "admin_scope"


class PolicyDeniedError(ForbiddenError):
    """The policy (`--policy`) denies this provider, module, version or platform: the body names the rule and its
    reason, and so does the status line's reason phrase (which Terraform prints for a refused SHA256SUMS)."""

    code = "policy_denied"

    def __init__(self, message: str, *, rule: str, reason: str, available_at: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.reason = reason
        self.available_at = available_at

    def document(self) -> dict:
        extra = {"available_at": self.available_at} if self.available_at else {}
        return {**super().document(), "rule": self.rule, "reason": self.reason, **extra}

    @property
    def reason_phrase(self) -> str:
        return status_reason(f"Denied by policy rule {self.rule}: {self.reason}")


class PolicyHeldBackError(PolicyDeniedError):
    """The version is younger than a min-age rule of the policy allows; `available_at` says when it will not be."""

    code = "policy_held_back"


class SigningKeyChangedError(PolicyDeniedError):
    """A release is signed by a key never seen for its provider, whose earlier releases another key signed, and
    the policy's `key-change` is `hold`: refused until an operator accepts the key (`registry-proxy trust accept`)."""

    code = "signing_key_changed"


class SigningKeyNotPinnedError(PolicyDeniedError):
    """A release of a provider a `[[pin]]` selects is signed by a key the pin does not list."""

    code = "signing_key_not_pinned"


def status_reason(text: str) -> str:
    """`text` as an HTTP reason phrase: one line of printable ASCII, at most 200 characters."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return cleaned[:200]


class NotFoundError(ProxyError):
    """The upstream (or the cache) does not have what was asked for."""

    status = 404
    code = "not_found"
    expected = True


class OfflineMissError(NotFoundError):
    """Running with --offline, and the cache does not have what was asked for."""

    code = "offline_miss"


class EndpointNotFoundError(NotFoundError):
    """No route of the proxy matches the path."""

    code = "endpoint_not_found"


class DocumentNotFoundError(NotFoundError):
    """The path names a document or file the protocol does not have (not `index.json` or `VERSION.json`, not
    `SHA256SUMS` or its signature, not the module's archive name)."""

    code = "document_not_found"


class CaNotFoundError(NotFoundError):
    """The proxy did not generate its TLS certificate, so it has no CA to hand out at `/ca.pem`."""

    code = "ca_not_found"


class ServiceNotFoundError(NotFoundError):
    """The registry host offers no registry services, or not the one asked for (its discovery document)."""

    code = "service_not_found"


class ProviderNotFoundError(NotFoundError):
    """The provider is not known to its registry."""

    code = "provider_not_found"


class RegistryModuleNotFoundError(NotFoundError):
    """The module is not known to its registry."""

    code = "module_not_found"


class VersionNotFoundError(NotFoundError):
    """The provider or module has no such version."""

    code = "version_not_found"


class PackageNotFoundError(NotFoundError):
    """The provider version has no package for the platform asked for."""

    code = "package_not_found"


class NotCachedError(NotFoundError):
    """A purge names a provider or module (or version) of which nothing is cached."""

    code = "not_cached"


class ModuleNotCachedError(NotFoundError):
    """The module's archive is asked for, but its source is not one the proxy caches (it is handed out as is)."""

    code = "module_not_cached"


class HostNotAllowedError(ForbiddenError):
    """The registry hostname is not in the operator's allowlist (or is private, for a proxy without client
    tokens: refused with the same answer, so that it does not confirm the private host exists)."""

    code = "host_not_allowed"

    @classmethod
    def for_host(cls, hostname: object) -> HostNotAllowedError:
        return cls(f"registry host {hostname} is not allowed by this proxy (the operator can add it with --allow-host)")


class UpstreamError(ProxyError):
    """The upstream failed (5xx, timeout, connection error, malformed answer)."""

    status = 502
    code = "upstream_error"


class UpstreamStatusError(UpstreamError):
    """The upstream answered with a status the protocol does not allow there (a 5xx, an unexpected 4xx)."""

    code = "upstream_status"


class UpstreamUnreachableError(UpstreamError):
    """The upstream could not be reached, or the connection failed or timed out."""

    code = "upstream_unreachable"


class UpstreamMalformedError(UpstreamError):
    """The upstream's answer is not what the protocol specifies (not JSON, a field missing or invalid)."""

    code = "upstream_malformed"


class UpstreamRedirectError(UpstreamError):
    """The upstream redirected to an invalid URL, or too many times."""

    code = "upstream_redirect"


class GitSourceError(UpstreamError):
    """A module's git source could not be cloned (git failed or timed out, or the URL is invalid)."""

    code = "git_failed"


class UpstreamTooLargeError(UpstreamError):
    """The upstream answer exceeded the configured size limit."""

    code = "upstream_too_large"


class ForbiddenAddressError(UpstreamError):
    """An upstream URL resolved to an address the SSRF guard refuses."""

    code = "forbidden_upstream_address"


class ModuleSourceRefusedError(UpstreamError):
    """The upstream's module source is of a form the proxy will not fetch or hand out."""

    code = "module_source_refused"


class VerificationError(UpstreamError):
    """An archive, checksum file or signature failed verification: a security event."""

    code = "verification_failed"


class SignatureInvalidError(VerificationError):
    """The release's SHA256SUMS is not validly signed by one of the registry's signing keys."""

    code = "signature_invalid"


class ChecksumMismatchError(VerificationError):
    """An archive's SHA-256 differs from what the signed SHA256SUMS (or the registry's shasum, or a module
    source's pin) says: tampered with or corrupted."""

    code = "checksum_mismatch"


class UnsignedRefusedError(VerificationError):
    """The registry lists no signing keys for the release, and `--unsigned-providers` does not admit it."""

    code = "unsigned_refused"


class FollowedDownloadLostError(UpstreamError):
    """The download a request followed in another proxy process ended without a verified archive."""

    code = "followed_download_lost"


class StoreCorruptionError(ProxyError):
    """A stored archive failed its integrity check while being served; it was quarantined."""

    status = 503
    code = "store_corruption"


class UpstreamBusyError(UpstreamError):
    """Every upstream slot (or every slot for one upstream host) stayed taken for too long."""

    status = 503
    code = "upstream_busy"


class UpstreamTooSlowError(UpstreamError):
    """A download stalled or stayed below the minimum transfer rate, and was aborted."""

    status = 504
    code = "upstream_too_slow"


class UpstreamTimeoutError(ProxyError):
    """The upstream did not answer within the request deadline (the shared fetch may go on).

    Not an UpstreamError: it is the request's own deadline, so it is never turned into a stale
    answer or a left-out platform by the handlers of upstream failures.
    """

    status = 504
    code = "upstream_timeout"


class ShuttingDownError(ProxyError):
    """The shared fetch a request waited for was cancelled because the proxy is shutting down."""

    status = 503
    code = "shutting_down"


class DiskFullError(ProxyError):
    """The data directory is below its free-space floor or out of space: nothing can be stored now."""

    status = 503
    code = "disk_full"
    expected = True


class StoreUnavailableError(ProxyError):
    """The archive store (object storage) could not be reached or refused a request."""

    status = 503
    code = "store_unavailable"


class AuditUnavailableError(ProxyError):
    """The audit log cannot be written (a full disk, a removed directory) and `--audit-required` is set: a request
    that would produce an audit event is refused until it can be, so nothing is served unaudited."""

    status = 503
    code = "audit_unavailable"


class OidcIssuerUnavailableError(ProxyError):
    """The OIDC token names a signing key the proxy does not hold, and its issuer's keys could not be fetched
    now (the issuer is unreachable or answers nonsense): retry later."""

    status = 503
    code = "oidc_issuer_unavailable"
    expected = True


class TooManyConnectionsError(ProxyError):
    """The proxy holds `--max-connections` client connections already (answered before the application)."""

    status = 503
    code = "too_many_connections"
    expected = True


# ---- the codes --------------------------------------------------------------------------------


def hierarchy() -> Iterator[type[ProxyError]]:
    """Every error class, depth first in definition order (the base first)."""

    def walk(cls: type[ProxyError]) -> Iterator[type[ProxyError]]:
        yield cls
        for sub in cls.__subclasses__():
            yield from walk(sub)

    return walk(ProxyError)


def code_table() -> str:
    """The Markdown table of every code (docs/errors.md holds it; a test keeps the two equal)."""
    rows = ["| code | status | error | logged as a failure | meaning |", "| --- | --- | --- | --- | --- |"]
    for cls in hierarchy():
        if cls is ProxyError:
            continue
        meaning = " ".join((cls.__doc__ or "").split("\n\n")[0].split())
        status = "as aiohttp chose" if cls is HttpRefusalError else str(cls.status)
        logged = "no" if cls.expected else "yes"
        rows.append(f"| `{cls.code}` | {status} | `{cls.__name__}` | {logged} | {meaning} |")
    return "\n".join(rows) + "\n"
