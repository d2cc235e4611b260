"""Serving verified archives from the store: ETag, Range, HEAD, conditional requests.

Over plain HTTP the kernel's sendfile does the work (`web.FileResponse`). Over TLS there is
no kernel TLS on these hosts, so bytes go through user space anyway; a loop writing 1 MiB
chunks is about ten times faster than aiohttp's sendfile emulation (PERF-NOTES).

No corrupted byte goes out (`proxy.integrity`). Over TLS every full GET is hashed as it is
read (same worker-thread hop) and its last chunk is held back until the whole file matched
its SHA-256; a mismatch aborts the connection, so the client sees a truncated body. Plain
HTTP uses sendfile only for a file verified since it last changed (device, inode, size,
mtime, ctime all unchanged); otherwise the body goes through the same hashing loop, which
makes the file trusted for the next sendfile. A range is served only from a verified file
(hashed whole first when needed). A copy found corrupt before the status line was sent is
quarantined and fetched again within the same request (`serve_found`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from proxy.errors import StoreCorruptionError
from proxy.httprange import UnsatisfiableRange, parse_range
from proxy.integrity import ArchiveReader, StoreGuard
from proxy.store import StoredArchive
from proxy.web.keys import GUARD, METRICS

CHUNK = 1 << 20
Found = tuple[StoredArchive, str, str]  # the stored file, its download name, its content type


async def serve_found(request: web.Request, find: Callable[[], Awaitable[Found]]) -> web.StreamResponse:
    """Serve what `find()` returns; a copy found corrupt before the first byte went out (it is
    quarantined by then) is looked up once more, which fetches and verifies it again."""
    stored, filename, content_type = await find()
    try:
        return await serve_archive(request, stored, filename, content_type)
    except StoreCorruptionError:
        if request.transport is None or request.transport.is_closing():
            raise
    stored, filename, content_type = await find()
    return await serve_archive(request, stored, filename, content_type)


async def serve_archive(request: web.Request, stored: StoredArchive, filename: str,
                        content_type: str = "application/zip") -> web.StreamResponse:
    etag = f'"{stored.sha256}"'
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Cache-Control": "public, max-age=31536000, immutable",
        "Content-Disposition": f'attachment; filename="{filename}"',
    }
    if etag in _etags(request.headers.get("If-None-Match")):
        return web.Response(status=304, headers=headers)
    guard, get = request.app[GUARD], request.method != "HEAD"
    if _plain(request) and (not get or await _sendfile_allowed(request, guard, stored)):
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
    if get and span is not None:
        await guard.verify(stored)  # a range cannot be hashed on its own
    reader = await guard.open(stored, start, length) if get and length else None
    try:
        response = web.StreamResponse(status=206 if span is not None else 200, headers=headers)
        response.content_type = content_type
        response.content_length = length
        if span is not None:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{stored.size}"
        await response.prepare(request)
        if reader is not None:
            try:
                await _copy(reader, response)
            except StoreCorruptionError:
                _abort(request)  # the status line is out: never let this response end normally
                raise
            request.app[METRICS].served_bytes.inc(length)
    finally:
        if reader is not None:
            reader.close()
    await response.write_eof()
    return response


async def _copy(reader: ArchiveReader, response: web.StreamResponse) -> None:
    async with contextlib.aclosing(reader.chunks(CHUNK)) as chunks:
        async for chunk in chunks:
            await response.write(chunk)


def _plain(request: web.Request) -> bool:
    return request.transport is not None and request.transport.get_extra_info("ssl_object") is None


async def _sendfile_allowed(request: web.Request, guard: StoreGuard, stored: StoredArchive) -> bool:
    """Plain HTTP: sendfile only from a file verified since it last changed (a range: verified first)."""
    if await guard.trusted(stored):
        return True
    if "Range" in request.headers:
        await guard.verify(stored)
        return True
    return False  # streamed through the hashing loop instead


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}
