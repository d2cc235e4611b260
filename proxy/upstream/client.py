"""The one owner of the upstream aiohttp ClientSession.

Bounded fetches of metadata into memory, streamed downloads of archives into a sink,
manual redirect handling (each hop re-checked by the SSRF guard), https only unless
the operator named the host, retries for idempotent GETs, and translation of every
transport failure into `proxy.errors`. Nothing above this module sees aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog
from yarl import URL

from proxy import __version__
from proxy.domain.credentials import UpstreamCredentials
from proxy.errors import (
    ForbiddenAddressError,
    UpstreamError,
    UpstreamRedirectError,
    UpstreamStatusError,
    UpstreamTooLargeError,
    UpstreamTooSlowError,
    UpstreamUnreachableError,
)
from proxy.runtime.client_reads import read_into_shared_buffer
from proxy.settings.config import Limits
from proxy.upstream.netguard import (
    AddressPolicy,
    GuardedResolver,
    RefusedAddressError,
    check_resolved,
    uses_egress_proxy,
)
from proxy.upstream.transfer import TransferRate

log = structlog.get_logger(__name__)

USER_AGENT = f"registry-proxy/{__version__}"
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PASS_STATUSES = frozenset({200, 204, 304, 404, 410})
RETRY_BACKOFF = 0.5
MIN_RETRY_TIME = 1.0  # a retry is only made if at least this long (or half the timeout) is left for it


@dataclass(frozen=True)
class UpstreamResponse:
    """A bounded, fully read upstream answer."""

    status: int
    body: bytes
    final_url: URL
    content_type: str
    etag: str | None
    terraform_get: str | None = None
    last_modified: str | None = None
    date: str | None = None  # the upstream's clock (`Date`), for `doctor`


Sink = Callable[[bytes], Awaitable[None]]


def create_ssl_context(extra_ca_file: Path | None) -> ssl.SSLContext:
    """System trust store plus the operator's extra CA bundle."""
    context = ssl.create_default_context()
    if extra_ca_file is not None:
        context.load_verify_locations(cafile=str(extra_ca_file))
    return context


class UpstreamClient:
    """Fetches from upstream registries within the configured limits."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        policy: AddressPolicy,
        limits: Limits,
        *,
        retries: int = 1,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        credentials: UpstreamCredentials | None = None,
    ) -> None:
        self._session = session
        self._credentials = credentials or UpstreamCredentials()
        self._policy = policy
        self._limits = limits
        self._retries = retries
        self._sleep = sleep
        self.observe: Callable[[str, float], None] | None = None  # (host, seconds to the answer's headers)

    @classmethod
    def create(
        cls,
        policy: AddressPolicy,
        limits: Limits,
        tls: ssl.SSLContext,
        credentials: UpstreamCredentials | None = None,
    ) -> UpstreamClient:
        """Build the session (must run inside the event loop); `tls` from `create_ssl_context`, which reads the
        trust store's files (call it off the loop)."""
        # Reading into the process's one buffer: no 256 KiB block mapped and unmapped per TLS record of a download.
        connector = read_into_shared_buffer(
            aiohttp.TCPConnector(
                resolver=GuardedResolver(policy),
                ssl=tls,
                limit=limits.upstream_concurrency * 4,
                ttl_dns_cache=60,
            )
        )
        session = aiohttp.ClientSession(
            connector=connector,
            trust_env=True,
            auto_decompress=True,
            headers={"User-Agent": USER_AGENT},
            trace_configs=[_connection_trace()],
        )
        return cls(session, policy, limits, credentials=credentials)

    async def close(self) -> None:
        await self._session.close()

    async def get(
        self,
        url: URL,
        *,
        max_bytes: int,
        accept: str = "application/json",
        etag: str | None = None,
        max_redirects: int | None = None,
    ) -> UpstreamResponse:
        """GET a small document. 200/304/404/410 are returned; anything else raises UpstreamError.

        The metadata timeout bounds the whole fetch, its retry included.
        """
        headers = {"Accept": accept}
        if etag:
            headers["If-None-Match"] = etag

        async def read(response: aiohttp.ClientResponse) -> UpstreamResponse:
            body = await _read_bounded(response, max_bytes, url)
            return UpstreamResponse(
                response.status,
                body,
                response.url,
                response.content_type,
                response.headers.get("ETag"),
                response.headers.get("X-Terraform-Get"),
                response.headers.get("Last-Modified"),
                response.headers.get("Date"),
            )

        return await self._with_retries(url, headers, read, max_redirects)

    async def download(
        self,
        url: URL,
        sink: Sink,
        *,
        max_bytes: int,
        on_response: Callable[[int | None], Awaitable[None]] | None = None,
    ) -> None:
        """Stream a 200 answer into `sink` chunk by chunk.
        `on_response(length)` runs before the first chunk, with the body's length if the upstream
        sent a Content-Length for the bytes as they reach the sink (no content coding).

        A download that sends nothing for the idle timeout, or less than the minimum rate over
        the rate window (checked after one window), is aborted with an UpstreamTooSlowError.
        """
        limits = self._limits
        timeout = aiohttp.ClientTimeout(total=None, connect=limits.connect_timeout, sock_read=limits.read_timeout)
        clock = asyncio.get_running_loop().time

        async def stream(response: aiohttp.ClientResponse) -> None:
            if response.status != 200:
                raise UpstreamStatusError(f"upstream answered {response.status} for {_show(url)}")
            if response.content_length is not None and response.content_length > max_bytes:
                raise UpstreamTooLargeError(f"{_show(url)} is larger than the {max_bytes}-byte limit")
            if on_response is not None:
                coded = response.headers.get("Content-Encoding", "identity").strip().lower() != "identity"
                await on_response(None if coded else response.content_length)
            rate = TransferRate(limits.min_download_rate, limits.download_rate_window, clock())
            total = 0
            while chunk := await _next_chunk(response, rate, clock, url):
                total += len(chunk)
                if total > max_bytes:
                    raise UpstreamTooLargeError(f"{_show(url)} is larger than the {max_bytes}-byte limit")
                rate.add(len(chunk), clock())
                await sink(chunk)

        # A half-written sink cannot be replayed, so downloads are not retried here.
        await self._request(url, {"Accept": "*/*"}, timeout, stream, None)

    async def open_spares(self, url: URL, count: int) -> None:
        """Open `count` more connections to `url`'s host into the pool, for the requests that follow: requests
        that then go out together find a connection each instead of each waiting for its own TCP and TLS
        handshakes. No request is sent (`BaseConnector.connect` with a request that is never sent; the connector
        applies the SSRF guard's resolver as for any request; aiohttp has no public way, and
        tests/unit/test_library_internals.py checks the one used). Not through an egress proxy (the connections
        would bypass it). Nothing of it fails anything: errors are dropped."""
        if uses_egress_proxy(url):
            return
        try:
            await self._check_url(url)
        except UpstreamError:
            return
        limits = self._limits
        timeout = aiohttp.ClientTimeout(total=limits.metadata_timeout, connect=limits.connect_timeout)
        connector = self._session.connector
        assert connector is not None

        async def one() -> None:
            request = aiohttp.ClientRequest("GET", url, loop=asyncio.get_running_loop())
            connection = await connector.connect(request, [], timeout)
            connection.release()  # into the pool, as after an answer read whole

        for outcome in await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True):
            if isinstance(outcome, Exception):
                log.debug("upstream.spare_failed", url=_show(url), error=str(outcome))
            else:
                log.debug("upstream.spare_opened", url=_show(url))

    async def _with_retries(self, url, headers, handle, max_redirects):
        clock = asyncio.get_running_loop().time
        give_up = clock() + self._limits.metadata_timeout
        attempt = 0
        while True:
            left = max(give_up - clock(), 0.001)
            timeout = aiohttp.ClientTimeout(total=left, connect=min(self._limits.connect_timeout, left))
            try:
                result = await self._request(url, headers, timeout, handle, max_redirects)
            except UpstreamError as exc:
                if isinstance(exc, ForbiddenAddressError | UpstreamTooLargeError) or not self._may_retry(
                    attempt, give_up - clock()
                ):
                    raise
                log.info("upstream.retry", url=_show(url), error=exc.message)
            else:
                if result.status < 500 or result.status == 501 or not self._may_retry(attempt, give_up - clock()):
                    return _raise_for_status(result, url)
                log.info("upstream.retry", url=_show(url), status=result.status)
            attempt += 1
            await self._sleep(RETRY_BACKOFF * attempt)

    def _may_retry(self, attempt: int, left: float) -> bool:
        """Another attempt is allowed, and after its backoff it still has time to finish within the timeout."""
        needed = min(MIN_RETRY_TIME, self._limits.metadata_timeout / 2)
        return attempt < self._retries and left - RETRY_BACKOFF * (attempt + 1) >= needed

    async def _request(
        self,
        url: URL,
        headers: dict[str, str],
        timeout: aiohttp.ClientTimeout,
        handle: Callable[[aiohttp.ClientResponse], Awaitable],
        max_redirects: int | None,
    ):
        hops = self._limits.max_redirects if max_redirects is None else max_redirects
        current = url
        for _ in range(hops + 1):
            await self._check_url(current)
            token = self._credentials.token_for(current)  # per hop: a redirect elsewhere goes without it
            hop_headers = {**headers, "Authorization": f"Bearer {token}"} if token else headers
            try:
                started = time.monotonic()
                async with self._session.get(
                    current, headers=hop_headers, timeout=timeout, allow_redirects=False
                ) as response:
                    waited = time.monotonic() - started
                    if self.observe is not None:
                        self.observe(self._credentials.counted_as(current), waited)
                    log.debug("upstream.answered", url=_show(current), status=response.status, seconds=round(waited, 4))
                    if response.status in REDIRECT_STATUSES and "Location" in response.headers:
                        try:
                            current = current.join(URL(response.headers["Location"]))
                        except ValueError:
                            raise UpstreamRedirectError(f"{_show(current)} redirected to an invalid URL") from None
                        continue
                    return await handle(response)
            except RefusedAddressError as exc:
                raise ForbiddenAddressError(f"refused to fetch {_show(current)}: {exc}") from None
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, RefusedAddressError):
                    raise ForbiddenAddressError(f"refused to fetch {_show(current)}: {exc.os_error}") from None
                raise UpstreamUnreachableError(f"cannot connect to {current.host}: {exc.os_error or exc}") from None
            except TimeoutError:
                raise UpstreamUnreachableError(f"timed out fetching {_show(current)}") from None
            except aiohttp.ClientError as exc:
                raise UpstreamUnreachableError(f"fetching {_show(current)} failed: {exc}") from None
        raise UpstreamRedirectError(f"too many redirects fetching {_show(url)}")

    async def _check_url(self, url: URL) -> None:
        if not url.host or url.scheme not in ("https", "http"):
            raise ForbiddenAddressError(f"refused to fetch {_show(url)}: only https URLs are fetched")
        if url.user or url.password:
            raise ForbiddenAddressError(f"refused to fetch {_show(url)}: URLs with credentials are not fetched")
        if url.scheme == "http" and not self._policy.is_exempt(url.host, url.port):
            raise ForbiddenAddressError(
                f"refused to fetch {_show(url)}: plain http is only allowed for "
                "hosts named in --upstream-map or --allow-private-host"
            )
        try:
            self._policy.check_literal(url)
            if uses_egress_proxy(url):  # the proxy connects, so our resolver would never see the name
                await check_resolved(url.host, url.port, self._policy)
        except RefusedAddressError as exc:
            raise ForbiddenAddressError(f"refused to fetch {_show(url)}: {exc}") from None


def _connection_trace() -> aiohttp.TraceConfig:
    """Debug lines for the cold path's timeline: each new upstream connection (with its TCP and TLS set-up
    time) and each reused one."""
    trace = aiohttp.TraceConfig()

    async def requested(session, context, params) -> None:
        context.url = _show(params.url)

    async def started(session, context, params) -> None:
        context.connecting = time.monotonic()

    async def created(session, context, params) -> None:
        log.debug("upstream.connected", url=context.url, seconds=round(time.monotonic() - context.connecting, 4))

    async def reused(session, context, params) -> None:
        log.debug("upstream.connection_reused", url=context.url)

    trace.on_request_start.append(requested)
    trace.on_connection_create_start.append(started)
    trace.on_connection_create_end.append(created)
    trace.on_connection_reuseconn.append(reused)
    return trace


async def _next_chunk(
    response: aiohttp.ClientResponse, rate: TransferRate, clock: Callable[[], float], url: URL
) -> bytes:
    """The next chunk of a download (b"" at the end), waited for only while the minimum rate can still hold."""
    while True:
        try:
            async with asyncio.timeout(rate.patience(clock())) as scope:
                return await response.content.read(1 << 20)
        except aiohttp.ServerTimeoutError:
            raise UpstreamTooSlowError(f"{_show(url)} sent nothing for too long; download aborted") from None
        except TimeoutError:
            if not scope.expired():
                raise
        if rate.too_slow(clock()):
            got = rate.received(clock()) / rate.window
            raise UpstreamTooSlowError(
                f"{_show(url)} arrived at {_per_second(got)} over the last {rate.window:g}s, below the minimum "
                f"of {_per_second(rate.min_rate)}; download aborted"
            )


def _per_second(rate: float) -> str:
    return f"{rate / 1024:.1f} KiB/s" if rate >= 1024 else f"{rate:.0f} B/s"


async def _read_bounded(response: aiohttp.ClientResponse, max_bytes: int, url: URL) -> bytes:
    if response.content_length is not None and response.content_length > max_bytes:
        raise UpstreamTooLargeError(f"{_show(url)} is larger than the {max_bytes}-byte limit")
    chunks, total = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        total += len(chunk)
        if total > max_bytes:
            raise UpstreamTooLargeError(f"{_show(url)} is larger than the {max_bytes}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _raise_for_status(result: UpstreamResponse, url: URL) -> UpstreamResponse:
    if result.status not in PASS_STATUSES:
        raise UpstreamStatusError(f"upstream answered {result.status} for {_show(url)}")
    return result


def _show(url: URL) -> str:
    """A URL for messages: no query string (it may carry signed tokens)."""
    return str(url.with_query(None).with_fragment(None))
