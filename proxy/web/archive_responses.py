"""Serving verified archives from the store: ETag, Range, HEAD, conditional requests.

Both modes answer conditionals and ranges alike (`proxy.protocol.http_ranges.evaluate`, ETag = SHA-256).
Over TLS there is no kernel TLS on these hosts, so bytes go through user space anyway; over
plain HTTP they do too, so that they are checked (no `sendfile`): a loop reads 112 KiB chunks
(`proxy.storage.ArchiveReader`, straight from the page cache in the event loop when its pages
are there, into one buffer per response, reused once no view of the last chunk is alive) and
writes each with `write_paced` (one slice of seven TLS records, waiting for the client between
chunks); the loop is about ten times faster than aiohttp's sendfile emulation
(docs/performance.md#serving-archives-over-tls). A client that stops reading pins about
0.5 MiB of the proxy's memory: its TLS state, one chunk and the slice in the write buffers,
no read-ahead (measured by bench/connections.py).

No stored archive goes out whole unless it matched its SHA-256 while it was sent
(docs/integrity.md#archive-stores): a full GET is hashed as it is read, on every request, and
its last chunk is held back until the whole file matched; a mismatch aborts the connection, so
the client sees a truncated body. A range is served only from a verified file (hashed whole
first unless it is the very file last found intact). A copy found corrupt before the status
line was sent is quarantined and fetched again within the same request (`serve_found`).

A `UpstreamRelay` (disk full, or a cold archive followed as it downloads, `proxy.services.live_downloads`) is
relayed as it arrives, whole (no Range), with the upstream's Content-Length when it has one,
else chunked; a HEAD of one is answered at once (with the length of a followed download),
without `Accept-Ranges`, so the client's GET after it asks for the whole body and follows the
download too. Headers go out with the first relayed chunk, so a refusal before that is a plain
JSON error; a refusal after it aborts the connection
with the last chunk (and, chunked, the final empty chunk) unsent: the body is never complete.
A client that goes away meanwhile is logged as on the warm path (`request.aborted`, 499).

`on_body` (the audit trail's `served` event) is called before the status line of a GET that sends the archive (or
redirects to it, `--archive-redirect`): what it raises (`audit_unavailable` under `--audit-required`) is an
ordinary error answer, nothing is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from proxy.errors import (
    FollowedDownloadLostError,
    PreconditionFailedError,
    RangeNotSatisfiableError,
    StoreCorruptionError,
    StoreUnavailableError,
)
from proxy.identity.tokens import GRANT_PARAM
from proxy.protocol.http_ranges import evaluate
from proxy.services.relay import UpstreamRelay
from proxy.storage import ArchiveGuard, ArchiveReader, StoredArchive
from proxy.web.app_keys import ARCHIVE_USAGE, GUARD, METRICS, SETTINGS
from proxy.web.server import WRITE_SLICE, write_paced

CHUNK = WRITE_SLICE  # read, hashed and written at a time (224 KiB chunks: the same CPU, more held per stalled client)
Found = tuple[StoredArchive | UpstreamRelay, str, str]  # the file (or a relay), its download name, its content type
log = structlog.get_logger(__name__)


def may_follow(request: web.Request) -> bool:
    """Whether a cold archive may be sent as it downloads: a whole GET (ranges and If-Match need the stored file),
    or a HEAD, answered as soon as the download is under way (the client's GET that follows it then follows the
    download too, instead of waiting for the whole archive twice over)."""
    return request.method in ("GET", "HEAD") and "Range" not in request.headers and "If-Match" not in request.headers


OnBody = Callable[[], None] | None  # called before a GET's archive is sent (`serve_found`)


async def serve_found(
    request: web.Request, find: Callable[[], Awaitable[Found]], on_body: OnBody = None
) -> web.StreamResponse:
    """Serve what `find()` returns; a copy found corrupt before the first byte went out (it is
    quarantined by then), or a download followed in a process that died before it, is looked up
    once more, which fetches and verifies it again."""
    stored, filename, content_type = await find()
    try:
        return await _serve_pinned(request, stored, filename, content_type, on_body)
    except (StoreCorruptionError, FollowedDownloadLostError):
        if request.transport is None or request.transport.is_closing():
            raise
    stored, filename, content_type = await find()
    return await _serve_pinned(request, stored, filename, content_type, on_body)


async def _serve_pinned(
    request: web.Request, stored: StoredArchive | UpstreamRelay, filename: str, content_type: str, on_body: OnBody
) -> web.StreamResponse:
    """`serve_archive`, the stored archive pinned against eviction while it is sent (and noted as served).

    An archive evicted between its lookup and the pin is gone when it is opened: StoreCorruptionError,
    so `serve_found` looks it up once more, which fetches it again."""
    if isinstance(stored, UpstreamRelay):
        if stored.stored_as is not None and request.method == "GET":  # a download followed as it arrives (its
            await request.app[ARCHIVE_USAGE].note(stored.stored_as)  # end only once stored) is a serve of it
        return await serve_archive(request, stored, filename, content_type, on_body)
    async with request.app[ARCHIVE_USAGE].serving(stored.sha256):
        return await serve_archive(request, stored, filename, content_type, on_body)


async def serve_archive(
    request: web.Request,
    stored: StoredArchive | UpstreamRelay,
    filename: str,
    content_type: str = "application/zip",
    on_body: OnBody = None,
) -> web.StreamResponse:
    if isinstance(stored, UpstreamRelay):
        return await _relay(request, stored, filename, content_type, on_body)
    etag = f'"{stored.sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes", **_common_headers(request, filename)}
    answer = evaluate(
        etag,
        stored.size,
        if_match=_field(request, "If-Match"),
        if_none_match=_field(request, "If-None-Match"),
        if_range=_field(request, "If-Range"),
        range_header=_field(request, "Range"),
    )
    if answer.status == 304:
        return web.Response(status=304, headers=headers)
    if answer.status == 412:
        raise PreconditionFailedError(f"precondition failed: the archive's ETag is {etag}")
    guard, settings = request.app[GUARD], request.app[SETTINGS]
    if settings.archives.archive_redirect and request.method != "HEAD":  # a URL signed for GET only
        redirect = await _redirect(request, guard, stored)
        if redirect is not None:
            if on_body is not None:  # the archive is served from the object store: recorded all the same
                on_body()
            return redirect
    if answer.status == 416:
        raise RangeNotSatisfiableError(
            f"range not satisfiable: the archive has {stored.size} bytes",
            headers={"Content-Range": f"bytes */{stored.size}"},
        )
    if on_body is not None and request.method == "GET":
        on_body()
    span = answer.span
    start, end = span if span is not None else (0, stored.size - 1)
    length = max(end - start + 1, 0)
    send = request.method != "HEAD" and length > 0
    if send and span is not None:
        await guard.verify(stored)  # a range cannot be hashed on its own
    reader = await guard.open(stored, start, length) if send else None  # before the status line: it may be gone
    try:
        response = web.StreamResponse(status=answer.status, headers=headers)
        response.content_type = content_type
        response.content_length = length
        if span is not None:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{stored.size}"
        await response.prepare(request)
        if reader is not None:
            try:
                await _copy(reader, response)
            except (StoreCorruptionError, StoreUnavailableError):
                _abort(request)  # the status line is out: never let this response end normally
                raise
        if send:
            request.app[METRICS].served_bytes.inc(length)
    finally:
        if reader is not None:
            reader.close()
    await response.write_eof()
    return response


async def _relay(
    request: web.Request, relay: UpstreamRelay, filename: str, content_type: str, on_body: OnBody
) -> web.StreamResponse:
    """Send a verified-on-the-way relay; abort the connection if it fails once the headers went out."""
    headers = _common_headers(request, filename)
    if relay.etag is not None:
        headers["ETag"] = f'"{relay.etag}"'
        if evaluate(headers["ETag"], 0, if_none_match=_field(request, "If-None-Match")).status == 304:
            return web.Response(status=304, headers=headers)
    response = web.StreamResponse(status=200, headers=headers)
    response.content_type = content_type
    if request.method == "HEAD":
        if relay.size is not None:
            response.content_length = relay.size
        await response.prepare(request)
        await response.write_eof()
        return response
    length: int | None = None

    async def begin(size: int | None) -> None:
        nonlocal length
        length = size

    def prepare() -> Awaitable[object]:
        if on_body is not None:
            on_body()
        return response.prepare(request)

    async def send(chunk: bytes) -> None:
        if not response.prepared:
            if length is not None:
                response.content_length = length
            await prepare()
        await write_paced(response, chunk)
        request.app[METRICS].served_bytes.inc(len(chunk))

    try:
        await relay.stream(begin, send)
    except BaseException as exc:
        if not response.prepared:
            raise  # nothing sent yet: an ordinary error answer
        if isinstance(exc, ConnectionError | asyncio.CancelledError):
            raise  # the client went away: the access log's 499, as on the warm path
        log.warning("archive.passthrough_aborted", filename=filename, error=getattr(exc, "message", repr(exc)))
        _abort(request)  # drop the connection: the withheld end of the body never follows
        if isinstance(exc, Exception):
            return response
        raise
    if not response.prepared:  # a verified empty body
        response.content_length = 0
        await prepare()
    await response.write_eof()
    return response


async def _redirect(request: web.Request, guard: ArchiveGuard, stored: StoredArchive) -> web.StreamResponse | None:
    """`--archive-redirect`: a stored archive answered with a short-lived presigned URL of its object (None
    where the store has no such URLs: served by the proxy); the client's own hash check (the mirror's
    `hashes`, the registry's `shasum`) guards what it downloads. The object is looked at once more while
    the archive is pinned (and noted as served), so one evicted since its lookup is fetched again
    (`serve_found`) instead of being redirected to."""
    expiry = request.app[SETTINGS].archives.archive_redirect_expiry
    location = await guard.presign(stored, expiry)
    if location is None:
        return None
    if not await guard.present(stored):  # evicted (or replaced) since its lookup: never a URL of nothing
        raise StoreCorruptionError(
            f"archive {stored.sha256} left the store before it was redirected to; it is looked up again"
        )
    request.app[METRICS].archive_redirects.inc()
    return web.Response(
        status=307, headers={"Location": location, "Cache-Control": "private, no-store", "ETag": f'"{stored.sha256}"'}
    )


def _common_headers(request: web.Request, filename: str) -> dict[str, str]:
    """Archives never change (immutable); one a client had to show a token or a grant for is `private`, so no
    shared cache in front of the proxy keeps it for clients without one."""
    scope = "private" if "Authorization" in request.headers or GRANT_PARAM in request.query else "public"
    return {
        "Cache-Control": f"{scope}, max-age=31536000, immutable",
        "Content-Disposition": f'attachment; filename="{filename}"',
    }


def _field(request: web.Request, name: str) -> str | None:
    """All lines of a request header joined as one list (None if absent or empty)."""
    return ", ".join(request.headers.getall(name, ())) or None


async def _copy(reader: ArchiveReader, response: web.StreamResponse) -> None:
    async with contextlib.aclosing(reader.chunks(CHUNK)) as chunks:
        async for chunk in chunks:
            await write_paced(response, chunk)
            del chunk  # before the next read: the reader's buffer is reused only once no view of it is alive


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
