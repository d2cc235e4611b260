"""A stalled object store for tests: an HTTPS reverse proxy in front of the real S3 server that can stop answering.

`StallingFront` relays every request to the S3 server (moto over HTTPS) unchanged, until a test tells it
to stall: `stall_requests` (a predicate) holds the matching requests without a byte of answer, and
`stall_body_after` sends the matching responses' status line, headers and only that many bytes of body,
then holds the connection open without sending more. Each stall sets `stalled` (tests wait on it) and
lasts until `stop()`; `stalls` counts them (one per attempt of the client). It can also answer wrongly
without stalling: `corrupt_body` flips one byte in the middle of the matching responses' bodies (a faulty
store or network), `drop_headers` leaves the named headers out of the matching responses (a malformed
answer), `cut_body_after` sends only that many bytes of the matching bodies and drops the connection (a
store closing early); `corrupted` and `cuts` count the bodies it changed and cut. The relay runs on an
event loop of its own in a thread, so it keeps relaying while the test's loop is blocked (a proxy opening
its store at start-up, for one).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable

import aiohttp
from aiohttp import web

Predicate = Callable[[web.Request], bool]
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-connection",
    "content-length",
}


class StallingFront:
    """An HTTPS relay to `target` (the S3 server) on a free loopback port; see the module docstring."""

    def __init__(self, target: str, server_ssl: ssl.SSLContext, client_ssl: ssl.SSLContext) -> None:
        self.target = target
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self.stall_requests: Predicate | None = None
        self.stall_body_after: tuple[Predicate, int] | None = None
        self.corrupt_body: Predicate | None = None
        self.drop_headers: tuple[Predicate, frozenset[str]] | None = None
        self.cut_body_after: tuple[Predicate, int] | None = None
        self.corrupted = 0
        self.cuts = 0
        self.stalled = threading.Event()
        self.stalls = 0
        self._release: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stalling-s3", daemon=True)
        self.url = ""

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)

    def stop(self) -> None:
        """End every stall (dropping its connection) and stop relaying."""
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    async def _start(self) -> None:
        self._release = asyncio.Event()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._client_ssl), auto_decompress=False
        )
        app = web.Application(client_max_size=2**30)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._server_ssl)
        await site.start()
        self.url = f"https://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _stop(self) -> None:
        assert self._release is not None
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _stall(self, request: web.Request) -> None:
        """Send nothing more until `stop()`, then drop the connection."""
        self.stalls += 1
        self.stalled.set()
        assert self._release is not None
        await self._release.wait()
        if request.transport is not None:
            request.transport.abort()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        if self.stall_requests is not None and self.stall_requests(request):
            await self._stall(request)
            return web.Response(status=503)
        cut = self.stall_body_after
        limit = cut[1] if cut is not None and cut[0](request) else None
        drop = self.drop_headers[1] if self.drop_headers is not None and self.drop_headers[0](request) else frozenset()
        corrupt = self.corrupt_body is not None and self.corrupt_body(request)
        cut_at = self.cut_body_after[1] if self.cut_body_after is not None and self.cut_body_after[0](request) else None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with self._session.request(
            request.method,
            self.target + request.raw_path,
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP - {"content-length"} and name.lower() not in drop:
                    response.headers.add(name, value)
            await response.prepare(request)
            sent = 0
            flip_at = (upstream.content_length or 0) // 2 if corrupt and upstream.status in (200, 206) else None
            async for chunk in upstream.content.iter_chunked(65536):
                if cut_at is not None and sent + len(chunk) > cut_at:
                    await response.write(chunk[: cut_at - sent])
                    self.cuts += 1
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if flip_at is not None and sent <= flip_at < sent + len(chunk):
                    changed = bytearray(chunk)
                    changed[flip_at - sent] ^= 0x01
                    chunk = bytes(changed)
                    self.corrupted += 1
                if limit is not None and sent + len(chunk) > limit:
                    await response.write(chunk[: limit - sent])
                    await self._stall(request)
                    return response
                await response.write(chunk)
                sent += len(chunk)
            await response.write_eof()
            return response
