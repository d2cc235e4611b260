"""Serving verified archives from the store: ETag, Range, HEAD, conditional requests.

Both modes answer conditionals and ranges alike (`proxy.httprange.evaluate`, ETag = SHA-256).
Over plain HTTP the kernel's sendfile copies the body. Over TLS there is no kernel TLS on
these hosts, so bytes go through user space anyway; a loop writing 1 MiB chunks is about
ten times faster than aiohttp's sendfile emulation (PERF-NOTES).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from proxy.httprange import evaluate
from proxy.store import StoredArchive
from proxy.web.keys import METRICS
from proxy.web.responses import error_response

CHUNK = 1 << 20


async def serve_archive(request: web.Request, stored: StoredArchive, filename: str,
                        content_type: str = "application/zip") -> web.StreamResponse:
    etag = f'"{stored.sha256}"'
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Cache-Control": "public, max-age=31536000, immutable",
        "Content-Disposition": f'attachment; filename="{filename}"',
    }
    answer = evaluate(etag, stored.size, if_match=_field(request, "If-Match"),
                      if_none_match=_field(request, "If-None-Match"), if_range=_field(request, "If-Range"),
                      range_header=_field(request, "Range"))
    if answer.status == 304:
        return web.Response(status=304, headers=headers)
    if answer.status == 412:
        return error_response(412, f"precondition failed: the archive's ETag is {etag}")
    if answer.status == 416:
        response = error_response(416, f"range not satisfiable: the archive has {stored.size} bytes")
        response.headers["Content-Range"] = f"bytes */{stored.size}"
        return response
    span = answer.span
    start, end = span if span is not None else (0, stored.size - 1)
    length = max(end - start + 1, 0)
    response = web.StreamResponse(status=answer.status, headers=headers)
    response.content_type = content_type
    response.content_length = length
    if span is not None:
        response.headers["Content-Range"] = f"bytes {start}-{end}/{stored.size}"
    await response.prepare(request)
    if request.method != "HEAD" and length:
        if request.transport is not None and request.transport.get_extra_info("ssl_object") is None:
            await _sendfile(request, stored, start, length)
        else:
            await _copy(stored, start, length, response)
        request.app[METRICS].served_bytes.inc(length)
    await response.write_eof()
    return response


def _field(request: web.Request, name: str) -> str | None:
    """All lines of a request header joined as one list (None if absent or empty)."""
    return ", ".join(request.headers.getall(name, ())) or None


async def _sendfile(request: web.Request, stored: StoredArchive, start: int, length: int) -> None:
    """Plain HTTP: the kernel copies the bytes (`sendfile`), as aiohttp's FileResponse would."""
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("client went away")
    handle = await asyncio.to_thread(open, stored.path, "rb")
    try:
        sent = await asyncio.get_running_loop().sendfile(transport, handle, start, length)
    finally:
        handle.close()
    if sent != length:
        raise ConnectionError("archive shrank while being served")


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
