"""Serving verified archives from the store: ETag, Range, HEAD, conditional requests.

Over plain HTTP the kernel's sendfile does the work (`web.FileResponse`). Over TLS there is
no kernel TLS on these hosts, so bytes go through user space anyway; a loop writing 1 MiB
chunks is about ten times faster than aiohttp's sendfile emulation (PERF-NOTES). Chunks are
256 KiB and written with `write_paced` (64 KiB slices, waiting for the client in between), so a
client that stops reading pins about 1 MiB of the proxy's memory, not 4 (bench/connections.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.httprange import UnsatisfiableRange, parse_range
from proxy.store import StoredArchive
from proxy.web.keys import METRICS
from proxy.web.server import write_paced

CHUNK = 1 << 18


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


async def _copy(stored: StoredArchive, start: int, length: int, response: web.StreamResponse) -> None:
    handle = await asyncio.to_thread(open, stored.path, "rb")
    try:
        await asyncio.to_thread(handle.seek, start)
        remaining = length
        while remaining > 0:
            chunk = await asyncio.to_thread(handle.read, min(CHUNK, remaining))
            if not chunk:
                raise ConnectionError("archive shrank while being served")
            await write_paced(response, chunk)
            remaining -= len(chunk)
    finally:
        handle.close()


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}
