"""Serving verified archives from the store: ETag, Range, HEAD, conditional requests.

Over plain HTTP the kernel's sendfile does the work (`web.FileResponse`). Over TLS there is
no kernel TLS on these hosts, so bytes go through user space anyway; a loop writing 1 MiB
chunks is about ten times faster than aiohttp's sendfile emulation (PERF-NOTES).

A `PassThrough` (disk full) is relayed as it arrives, whole (no Range), with the upstream's
Content-Length when it has one, else chunked. Headers go out with the first relayed chunk,
so a refusal before that is a plain JSON error; a refusal after it aborts the connection
with the last chunk (and, chunked, the final empty chunk) unsent: the body is never complete.
"""

from __future__ import annotations

import asyncio

import structlog
from aiohttp import web

from proxy.httprange import UnsatisfiableRange, parse_range
from proxy.passthrough import PassThrough
from proxy.store import StoredArchive
from proxy.web.keys import METRICS

CHUNK = 1 << 20
log = structlog.get_logger(__name__)


async def serve_archive(request: web.Request, stored: StoredArchive | PassThrough, filename: str,
                        content_type: str = "application/zip") -> web.StreamResponse:
    if isinstance(stored, PassThrough):
        return await _relay(request, stored, filename, content_type)
    etag = f'"{stored.sha256}"'
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        **_common_headers(filename),
    }
    if etag in _etags(request.headers.get("If-None-Match")):
        return web.Response(status=304, headers=headers)
    if request.transport is not None and request.transport.get_extra_info("ssl_object") is None:
        response = web.FileResponse(stored.path, chunk_size=CHUNK, headers=headers)
        response.content_type = content_type
        request.app[METRICS].served_bytes.inc(0 if request.method == "HEAD" else stored.size)
        return response
    try:
        span = parse_range(request.headers.get("Range"), stored.size)
    except UnsatisfiableRange:
        return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{stored.size}"})
    start, end = span if span is not None else (0, stored.size - 1)
    length = max(end - start + 1, 0)
    response = web.StreamResponse(status=206 if span is not None else 200, headers=headers)
    response.content_type = content_type
    response.content_length = length
    if span is not None:
        response.headers["Content-Range"] = f"bytes {start}-{end}/{stored.size}"
    await response.prepare(request)
    if request.method != "HEAD" and length:
        await _copy(stored, start, length, response)
        request.app[METRICS].served_bytes.inc(length)
    await response.write_eof()
    return response


async def _relay(request: web.Request, relay: PassThrough, filename: str, content_type: str) -> web.StreamResponse:
    """Send a verified-on-the-way relay; abort the connection if it fails once the headers went out."""
    headers = _common_headers(filename)
    if relay.etag is not None:
        headers["ETag"] = f'"{relay.etag}"'
        if headers["ETag"] in _etags(request.headers.get("If-None-Match")):
            return web.Response(status=304, headers=headers)
    response = web.StreamResponse(status=200, headers=headers)
    response.content_type = content_type
    if request.method == "HEAD":
        await response.prepare(request)
        await response.write_eof()
        return response
    length: int | None = None

    async def begin(size: int | None) -> None:
        nonlocal length
        length = size

    async def send(chunk: bytes) -> None:
        if not response.prepared:
            if length is not None:
                response.content_length = length
            await response.prepare(request)
        await response.write(chunk)
        request.app[METRICS].served_bytes.inc(len(chunk))

    try:
        await relay.stream(begin, send)
    except BaseException as exc:
        if not response.prepared:
            raise  # nothing sent yet: an ordinary error answer
        log.warning("archive.passthrough_aborted", filename=filename, error=getattr(exc, "message", repr(exc)))
        if request.transport is not None:
            request.transport.abort()  # drop the connection: the withheld end of the body never follows
        if isinstance(exc, Exception):
            return response
        raise
    if not response.prepared:  # a verified empty body
        response.content_length = 0
        await response.prepare(request)
    await response.write_eof()
    return response


def _common_headers(filename: str) -> dict[str, str]:
    return {"Cache-Control": "public, max-age=31536000, immutable",
            "Content-Disposition": f'attachment; filename="{filename}"'}


async def _copy(stored: StoredArchive, start: int, length: int, response: web.StreamResponse) -> None:
    handle = await asyncio.to_thread(open, stored.path, "rb")
    try:
        await asyncio.to_thread(handle.seek, start)
        remaining = length
        while remaining > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK, remaining))
            if not chunk:
                raise ConnectionError("archive shrank while being served")
            await response.write(chunk)
            remaining -= len(chunk)
    finally:
        handle.close()


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}
