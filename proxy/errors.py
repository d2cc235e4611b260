"""The proxy's error hierarchy: each error knows its HTTP status and whether it is expected.

Handlers raise these (or let them propagate); one middleware renders them as
`{"errors": [message]}` with the status. Nothing here imports aiohttp.
"""

from __future__ import annotations


class ProxyError(Exception):
    """Base class: a failure with a user-facing message and an HTTP status."""

    status: int = 500
    code: str = "internal_error"
    expected: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(ProxyError):
    """The client asked for something malformed (bad address, version, platform)."""

    status = 400
    code = "invalid_request"
    expected = True


class NotFoundError(ProxyError):
    """The upstream (or the cache) does not have what was asked for."""

    status = 404
    code = "not_found"
    expected = True


class OfflineMissError(NotFoundError):
    """Running with --offline, and the cache does not have what was asked for."""

    code = "offline_miss"


class HostNotAllowedError(ProxyError):
    """The registry hostname is not in the operator's allowlist (or is private, for a proxy without client
    tokens: refused with the same answer, so that it does not confirm the private host exists)."""

    status = 403
    code = "host_not_allowed"
    expected = True

    @classmethod
    def for_host(cls, hostname: object) -> HostNotAllowedError:
        return cls(f"registry host {hostname} is not allowed by this proxy (the operator can add it with --allow-host)")


class UpstreamError(ProxyError):
    """The upstream failed (5xx, timeout, connection error, malformed answer)."""

    status = 502
    code = "upstream_error"


class UpstreamTooLargeError(UpstreamError):
    """The upstream answer exceeded the configured size limit."""

    code = "upstream_too_large"


class ForbiddenAddressError(UpstreamError):
    """An upstream URL resolved to an address the SSRF guard refuses."""

    code = "forbidden_upstream_address"


class VerificationError(UpstreamError):
    """An archive, checksum file or signature failed verification: a security event."""

    code = "verification_failed"


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
