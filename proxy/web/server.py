"""The HTTP server: the listener, per-connection limits, and running until SIGTERM/SIGINT.

aiohttp's `web.run_app` has no connection cap, no request-head or send timeout, no TLS
handshake timeout below 60 s, and answers protocol errors in plain text. This module keeps
`run_app`'s life cycle (graceful shutdown on a signal, `shutdown_timeout` for requests in
flight) but builds the listener itself with `loop.create_server`, and each connection is a
`LimitedRequestHandler` (aiohttp's `RequestHandler` plus the limits below). `serve_app` is that
life cycle: `run_server` runs it in this process, `proxy.web.workers` in each worker process.

- `--max-connections`: an admitted connection holds a slot until it closes; beyond the cap
  a new connection gets a 503 JSON answer and is closed at once (counted, logged once per
  burst). TLS costs about 0.3 MiB per open connection, so the cap bounds memory.
- `--client-header-timeout`: from accept (the TLS handshake included) to the first complete
  request head; then `--keepalive-timeout` bounds the idle time between requests.
- `--send-timeout`: the longest time the connection may stay write-blocked (its send buffer
  above the high-water mark) without the client taking more; then it is aborted, which
  fails the handler's next write so it unwinds (files closed). Write buffers are kept small
  (`WRITE_BUFFER_HIGH`); large bodies are written with `write_paced`.
- Protocol errors (oversized request line or header, bad method, bad version) get a JSON
  `{"errors": [...]}` body with 414/431/400 instead of aiohttp's plain text.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.web.eventloop import new_event_loop
from proxy.web.keys import METRICS
from proxy.web.middlewares import SERVER
from proxy.web.responses import error_response

log = structlog.get_logger("proxy.server")

WRITE_BUFFER_HIGH = 64 * 1024  # bytes queued per connection before writers wait (asyncio: 512 KiB for TLS)
MAX_REQUEST_LINE = 8192  # method, target and version (414 beyond)
MAX_HEADER_LINE = 8190  # one header field (431 beyond; aiohttp's default); must differ from MAX_REQUEST_LINE
MAX_HEADERS = 128  # header fields per request (431 beyond)
BACKLOG = 511  # nginx's listen backlog
SPARE_FILES = 256  # file descriptors beyond one per connection: archives, stores, upstream sockets


@dataclass(frozen=True)
class ConnectionLimits:
    """What one listener allows each client connection (see the module docstring)."""

    max_connections: int = 1024
    header_timeout: float = 10.0
    keepalive_timeout: float = 15.0
    send_timeout: float = 60.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            settings.max_connections, settings.client_header_timeout, settings.keepalive_timeout, settings.send_timeout
        )


class ConnectionGate:
    """Counts the open connections of a listener against the cap."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.open = 0
        self.metrics = metrics
        self._refusing = False

    def admit(self) -> bool:
        if self.open >= self.limit:
            self.metrics.connections_refused.inc()
            if not self._refusing:  # once per burst, not once per connection
                self._refusing = True
                log.warning("connection.limit_reached", max_connections=self.limit)
            return False
        self._refusing = False
        self.open += 1
        self.metrics.connections_open.set(self.open)
        return True

    def release(self) -> None:
        self.open -= 1
        self.metrics.connections_open.set(self.open)


def _raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response as bytes, for a connection that never reaches the application."""
    body = error_response(status, message).body
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


TOO_MANY_CONNECTIONS = _raw_error(503, "Service Unavailable", "too many connections; retry later")


class LimitedRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol with a connection cap, timeouts and JSON protocol errors."""

    def __init__(
        self, manager: web.Server, *, gate: ConnectionGate, limits: ConnectionLimits, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(
            manager,
            loop=loop,
            access_log=None,
            keepalive_timeout=limits.keepalive_timeout,
            max_line_size=MAX_REQUEST_LINE,
            max_field_size=MAX_HEADER_LINE,
            max_headers=MAX_HEADERS,
        )
        self._gate = gate
        self._limits = limits
        self._accepted_at = loop.time()  # the protocol is made on accept, before the TLS handshake
        self._admitted = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    # ---- connection cap and request-head timeout -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._gate.admit():
            transport.write(TOO_MANY_CONNECTIONS)  # type: ignore[attr-defined]
            transport.close()
            return
        self._admitted = True
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)  # type: ignore[attr-defined]
        self._header_timer = self._loop.call_at(
            self._accepted_at + self._limits.header_timeout, self._drop, "header_timeout"
        )

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        super().data_received(data)
        if self._header_timer is not None and self._request_count:  # a whole head (or a parse error) arrived
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._gate.release()
        for timer in (self._header_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    # ---- send timeout -----------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        self._send_timer = self._loop.call_later(self._limits.send_timeout, self._drop, "send_timeout")

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def _drop(self, reason: str) -> None:
        """Reset the connection: no graceful TLS close, and the kernel discards what the client
        did not take (nginx's `reset_timedout_connection`), else the FIN waits behind it."""
        transport = self.transport
        if transport is None:
            return
        self._gate.metrics.connections_dropped.labels(reason).inc()
        log.info(
            f"connection.{reason}",
            remote=_host(transport.get_extra_info("peername")),
            connected_s=round(self._loop.time() - self._accepted_at, 3),
        )
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()

    # ---- protocol errors --------------------------------------------------------------------

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> StreamResponse:
        """The answer to a request the application never saw, as JSON; a client gone is not an error."""
        if isinstance(exc, ConnectionError) or request.writer.output_size > 0:
            raise exc if isinstance(exc, ConnectionError) else ConnectionError("response already started")
        status, text = self._describe(status, exc)
        self._gate.metrics.requests.labels("unmatched", str(status)).inc()
        log.info("request.rejected", status=status, error=text, remote=request.remote)
        response = error_response(status, text)
        response.headers["Server"] = SERVER
        response.force_close()
        return response

    def _describe(self, status: int, exc: BaseException | None) -> tuple[int, str]:
        """Status and a fixed message: the client's own bytes are never echoed back."""
        if isinstance(exc, http_exceptions.LineTooLong):
            if exc.args[1:2] == (MAX_REQUEST_LINE,):
                return 414, f"request line too long: at most {MAX_REQUEST_LINE} bytes"
            return 431, f"request header fields too large: at most {MAX_HEADER_LINE} bytes each"
        if isinstance(exc, http_exceptions.BadHttpMessage) and "Too many headers" in exc.message:
            return 431, f"request header fields too large: at most {MAX_HEADERS} fields"
        if isinstance(exc, http_exceptions.BadHttpMethod):
            return 400, "malformed request: invalid method"
        if isinstance(exc, http_exceptions.BadStatusLine):
            return 400, "malformed request: invalid request line or HTTP version"
        if isinstance(exc, http_exceptions.HttpProcessingError):
            return 400, f"malformed request: {type(exc).__name__}"
        return status, "internal error; see the proxy log"


def _host(peer: object) -> str | None:
    return peer[0] if isinstance(peer, tuple) else None


async def write_paced(response: StreamResponse, data: bytes) -> None:
    """Write `data` in slices no larger than the write buffer's high-water mark, waiting for the
    client between slices: a client that stops reading then pins at most about two slices of
    this connection's memory instead of a whole chunk several times over (TLS copies it)."""
    view = memoryview(data)
    for offset in range(0, len(view), WRITE_BUFFER_HIGH):
        await response.write(view[offset : offset + WRITE_BUFFER_HIGH])


# ---- running ------------------------------------------------------------------------------


def _ensure_file_limit(needed: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards `needed` (up to the hard limit); warn if it stays lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < needed:
        log.warning(
            "server.file_limit",
            open_files=soft,
            needed=needed,
            hint="raise the open-files limit (ulimit -n) or lower --max-connections",
        )


async def start_listener(
    runner: web.AppRunner,
    ssl_context: ssl.SSLContext | None,
    limits: ConnectionLimits,
    *,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Listen on host:port (or on the listening socket `sock`); every connection is a
    LimitedRequestHandler of `runner`'s server."""
    loop = asyncio.get_running_loop()
    server = runner.server
    assert server is not None, "runner.setup() first"
    gate = ConnectionGate(limits.max_connections, runner.app[METRICS])
    factory: Callable[[], LimitedRequestHandler] = lambda: LimitedRequestHandler(  # noqa: E731
        server, gate=gate, limits=limits, loop=loop
    )
    tls = (
        {}
        if ssl_context is None
        else {"ssl_handshake_timeout": limits.header_timeout, "ssl_shutdown_timeout": min(limits.send_timeout, 30.0)}
    )
    _ensure_file_limit(limits.max_connections + SPARE_FILES)
    return await loop.create_server(factory, host, port, sock=sock, ssl=ssl_context, backlog=BACKLOG, **tls)


Listen = Callable[[web.AppRunner], Awaitable[list[asyncio.Server]]]


async def serve_app(
    app: web.Application,
    listen: Listen,
    stopped: Callable[[], Awaitable[object]],
    *,
    shutdown_timeout: float,
    handle_signals: bool = False,
) -> None:
    """Start `app`, `listen`, wait until `stopped()` returns (or, with `handle_signals`, SIGTERM or SIGINT
    raises GracefulExit), then stop listening and shut down gracefully: idle connections are closed,
    requests in flight get `shutdown_timeout` seconds to finish."""
    runner = web.AppRunner(app, handle_signals=handle_signals, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    listeners: list[asyncio.Server] = []
    try:
        listeners = await listen(runner)
        await stopped()
    finally:
        for listener in listeners:
            listener.close()
        await runner.cleanup()


def run_server(
    app: web.Application,
    settings: Settings,
    ssl_context: ssl.SSLContext | None,
    *,
    shutdown_timeout: float,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve `app` in this process until SIGTERM or SIGINT, then shut down gracefully (like `web.run_app`).

    `shutdown_timeout`: how long requests in flight may take to finish after the signal;
    `on_listening`: called once the listening socket is bound.
    """
    limits = ConnectionLimits.from_settings(settings)

    async def listen(runner: web.AppRunner) -> list[asyncio.Server]:
        listeners = [
            await start_listener(runner, ssl_context, limits, host=settings.listen_host, port=settings.listen_port)
        ]
        if on_listening is not None:
            on_listening()
        return listeners

    loop = new_event_loop(settings.event_loop)
    asyncio.set_event_loop(loop)
    run_until_complete(
        loop,
        serve_app(
            app,
            listen,
            lambda: asyncio.Event().wait(),  # until a signal
            shutdown_timeout=shutdown_timeout,
            handle_signals=True,
        ),
    )


def run_until_complete(loop: asyncio.AbstractEventLoop, main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on `loop`; a GracefulExit or KeyboardInterrupt cancels it (its `finally` shuts down
    gracefully). Then cancel every task left and close the loop."""
    task = loop.create_task(main)
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not task.done():
                task.cancel()
                with suppress(asyncio.CancelledError):
                    loop.run_until_complete(task)
        finally:
            rest = [pending for pending in asyncio.all_tasks(loop) if not pending.done()]
            for pending in rest:
                pending.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
