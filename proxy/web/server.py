"""The HTTP server: the listener, per-connection limits, and running until SIGTERM/SIGINT.

aiohttp's `web.run_app` has no connection cap, no request-head or send timeout, no TLS
handshake timeout below 60 s, and answers protocol errors in plain text. This module keeps
`run_app`'s life cycle (graceful shutdown on a signal, `shutdown_timeout` for requests in
flight) but builds the listener itself with `loop.create_server`, and each connection is a
`LimitedConnection`: an asyncio protocol that enforces the limits below and passes every event on
to aiohttp's own protocol for the connection (composition over the public asyncio protocol interface;
the one subclass of an aiohttp internal, for the JSON protocol errors, is in
`proxy.web.aiohttp_internals`). `serve_app` is that life cycle: `run_server` runs it in this process,
`proxy.web.workers` in each worker process. The listening socket is bound at start, before anything
else is set up (`proxy.web.listener`): a port in use is one line and exit 2, not retries.

- `--max-connections`: an admitted connection holds a slot until it closes; beyond the cap
  a new connection gets a 503 JSON answer and is closed at once (counted, logged once per
  burst). An idle TLS connection costs about 0.02 MiB on uvloop and 0.3 MiB on asyncio (its
  zero-filled 256 KiB read buffer), so the cap bounds memory; once a burst of connections has
  closed, their memory goes back to the system (`proxy.web.allocator`).
- `--client-header-timeout`: from accept (the TLS handshake included) to the first complete
  request head (`proxy.web.middlewares.request_context` says when, through `request_arrived`); then
  `--keepalive-timeout` bounds the idle time between requests.
- `--send-timeout`: the longest time the connection may stay write-blocked (its send buffer
  above the high-water mark) without the client taking more; then it is aborted, which
  fails the handler's next write so it unwinds (files closed). Write buffers are kept small
  (`WRITE_BUFFER_HIGH`); large bodies are written with `write_paced`, in slices of `WRITE_SLICE`.
- Protocol errors (oversized request line or header, bad method, bad version) get a JSON
  `{"errors": [...]}` body with 414/431/400 instead of aiohttp's plain text.

A connection reads into one buffer of the process (`proxy.runtime.shared_reads`, a buffered protocol) and
hands aiohttp a copy of what arrived: the SSL protocols of asyncio and uvloop otherwise allocate a 256 KiB block
for every read of decrypted bytes, which, with glibc's mmap threshold pinned at 128 KiB (`proxy.web.allocator`),
is an mmap, an mremap and an munmap per request, and they then learn that nothing more is pending from an
`SSLWantReadError`, where the buffered path looks at what is pending. The buffer holds all that is pending, so
nothing a client sent before it closed is lost.
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
from typing import Any, cast

import structlog
from aiohttp import web

from proxy.errors import (
    HttpRefusalError,
    InternalError,
    MalformedRequestError,
    ProxyError,
    RequestHeadersTooLargeError,
    RequestLineTooLongError,
    TooManyConnectionsError,
)
from proxy.runtime.metrics import Metrics
from proxy.runtime.shared_reads import SharedReadBuffer
from proxy.settings.config import Settings
from proxy.web.aiohttp_internals import describe_parse_error, new_request_handler, put_in_front
from proxy.web.allocator import BurstTrimmer, pin_mmap_threshold
from proxy.web.app_keys import METRICS
from proxy.web.eventloop import new_event_loop
from proxy.web.listener import BACKLOG
from proxy.web.middlewares import SERVER
from proxy.web.responses import error_response

log = structlog.get_logger("proxy.server")

WRITE_BUFFER_HIGH = 64 * 1024  # bytes queued per connection before writers wait (asyncio: 512 KiB for TLS)
# `write_paced`'s slices: seven whole TLS records, which the SSL protocol reads out of OpenSSL's memory BIO as one
# `bytes` of 114,842 bytes, under glibc's mmap threshold pinned at 128 KiB (`proxy.web.allocator`), so from the
# heap, not a new mapping. Each slice is one SSL write, one BIO read and one send: 112 KiB slices took 5-10 % less
# CPU per GiB than 64 KiB ones (docs/performance.md#slices-of-seven-tls-records-issue-23-item-4).
WRITE_SLICE = 7 * 16 * 1024
MAX_REQUEST_LINE = 8192  # method, target and version (414 beyond)
MAX_HEADER_LINE = 8190  # one header field (431 beyond; aiohttp's default); must differ from MAX_REQUEST_LINE
MAX_HEADERS = 128  # header fields per request (431 beyond)
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
            settings.server.max_connections,
            settings.server.client_header_timeout,
            settings.server.keepalive_timeout,
            settings.server.send_timeout,
        )


class ConnectionGate:
    """Counts the open connections of a listener against the cap (and has the memory of a burst of them
    returned to the system once it is over: `proxy.web.allocator`)."""

    def __init__(self, limit: int, metrics: Metrics, trimmer: BurstTrimmer | None = None) -> None:
        self.limit = limit
        self.open = 0
        self.metrics = metrics
        self.trimmer = trimmer or BurstTrimmer()
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
        self.trimmer.opened(self.open)
        return True

    def release(self) -> None:
        self.open -= 1
        self.metrics.connections_open.set(self.open)
        self.trimmer.closed(self.open)


def _raw_error(error: ProxyError, reason: str) -> bytes:
    """A whole HTTP/1.1 error response as bytes, for a connection that never reaches the application."""
    body = error_response(error).body
    head = (
        f"HTTP/1.1 {error.status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


TOO_MANY_CONNECTIONS = _raw_error(TooManyConnectionsError("too many connections; retry later"), "Service Unavailable")


class LimitedConnection(asyncio.BufferedProtocol):
    """One client connection: admitted against the cap (else answered 503 and closed), dropped when its
    first request head has not arrived `header_timeout` after accept or when it stays write-blocked for
    `send_timeout`. Everything else is aiohttp's protocol for the connection, made once it is admitted,
    which gets every event (what arrived as `data_received`, read into the process's `SharedReadBuffer`)."""

    def __init__(
        self,
        gate: ConnectionGate,
        limits: ConnectionLimits,
        new_handler: Callable[[], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._gate = gate
        self._limits = limits
        self._new_handler = new_handler
        self._loop = loop
        self._accepted_at = loop.time()  # made on accept, before the TLS handshake
        self._transport: asyncio.Transport | None = None
        self._handler: asyncio.Protocol | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    # ---- connection cap and request-head timeout -------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's transports do not derive from asyncio's
        if not self._gate.admit():
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._transport = transport
        self._handler = self._new_handler()
        self._handler.connection_made(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self._header_timer = self._loop.call_at(
            self._accepted_at + self._limits.header_timeout, self._drop, "header_timeout"
        )

    def request_arrived(self) -> None:
        """A whole request head arrived (the first one stops the request-head timer)."""
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    # Where the transport puts what arrives (`get_buffer(sizehint)`): the process's one buffer, large enough for all
    # that is pending, handed on in `buffer_updated` before any other connection reads (asyncio and uvloop call the
    # two back to back). The buffer's own function: no call of this protocol's in between, per read.
    get_buffer = staticmethod(SharedReadBuffer.get)

    def buffer_updated(self, nbytes: int) -> None:
        if self._handler is not None:
            SharedReadBuffer.hand_on(nbytes, self._handler.data_received)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._handler is not None else None

    def connection_lost(self, exc: BaseException | None) -> None:
        handler, self._handler = self._handler, None
        if handler is None:  # refused at the cap, or already lost
            return
        self._gate.release()
        for timer in (self._header_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._send_timer = None
        self._transport = None
        handler.connection_lost(exc)

    # ---- send timeout -----------------------------------------------------------------------

    def pause_writing(self) -> None:
        if self._handler is None:
            return
        self._handler.pause_writing()
        if self._send_timer is None:
            self._send_timer = self._loop.call_later(self._limits.send_timeout, self._drop, "send_timeout")

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        if self._handler is not None:
            self._handler.resume_writing()

    def _drop(self, reason: str) -> None:
        """Reset the connection: no graceful TLS close, and the kernel discards what the client
        did not take (nginx's `reset_timedout_connection`), else the FIN waits behind it."""
        transport = self._transport
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


_PARSE_ERRORS: dict[int, type[ProxyError]] = {
    414: RequestLineTooLongError,
    431: RequestHeadersTooLargeError,
    400: MalformedRequestError,
}


def _describe(status: int, exc: BaseException | None) -> ProxyError:
    """The error of the hierarchy, with a fixed message: the client's own bytes are never echoed back."""
    described = describe_parse_error(exc, max_line=MAX_REQUEST_LINE, max_field=MAX_HEADER_LINE, max_headers=MAX_HEADERS)
    if described is not None:
        parsed_status, text = described
        return _PARSE_ERRORS.get(parsed_status, MalformedRequestError)(text)
    if status == 500:
        return InternalError("internal error; see the proxy log")
    return HttpRefusalError(f"request refused (HTTP {status}); see the proxy log", status)


def rejecter(metrics: Metrics) -> Callable[[web.BaseRequest, int, BaseException | None], web.StreamResponse]:
    """The answer to a request the application never saw (unparsable, or failing outside it), as JSON."""

    def reject(request: web.BaseRequest, status: int, exc: BaseException | None) -> web.StreamResponse:
        error = _describe(status, exc)
        metrics.requests.labels("unmatched", str(error.status)).inc()
        log.info("request.rejected", status=error.status, error=error.message, code=error.code, remote=request.remote)
        response = error_response(error)
        response.headers["Server"] = SERVER
        response.force_close()
        return response

    return reject


def _host(peer: object) -> str | None:
    return peer[0] if isinstance(peer, tuple) else None


async def write_paced(response: web.StreamResponse, data: bytes) -> None:
    """Write `data` in slices of `WRITE_SLICE`, waiting for the client between slices (once the
    write buffer is above its high-water mark): a client that stops reading then pins about one
    slice of this connection's memory instead of a whole chunk several times over (TLS copies it)."""
    view = memoryview(data)
    for offset in range(0, len(view), WRITE_SLICE):
        await response.write(view[offset : offset + WRITE_SLICE])


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
    sock: socket.socket,
) -> asyncio.Server:
    """Accept connections on the listening socket `sock`; every connection is a LimitedConnection around a
    protocol of `runner`'s server."""
    loop = asyncio.get_running_loop()
    server = runner.server
    assert server is not None, "runner.setup() first"
    gate = ConnectionGate(limits.max_connections, runner.app[METRICS])
    reject = rejecter(gate.metrics)

    def new_handler() -> asyncio.Protocol:
        return new_request_handler(
            server,
            reject,
            keepalive_timeout=limits.keepalive_timeout,
            max_line_size=MAX_REQUEST_LINE,
            max_field_size=MAX_HEADER_LINE,
            max_headers=MAX_HEADERS,
        )

    def factory() -> LimitedConnection:
        return LimitedConnection(gate, limits, new_handler, loop)

    tls = (
        {}
        if ssl_context is None
        else {"ssl_handshake_timeout": limits.header_timeout, "ssl_shutdown_timeout": min(limits.send_timeout, 30.0)}
    )
    _ensure_file_limit(limits.max_connections + SPARE_FILES)
    return await loop.create_server(factory, sock=sock, ssl=ssl_context, backlog=BACKLOG, **tls)


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
    requests in flight get `shutdown_timeout` seconds to finish. A start that fails (or is cancelled) closes
    the resources the application had opened (its cleanup contexts' exits), then raises."""
    runner = web.AppRunner(app, handle_signals=handle_signals, access_log=None, shutdown_timeout=shutdown_timeout)
    listeners: list[asyncio.Server] = []
    try:
        await runner.setup()
        put_in_front(runner)  # `proxy.web.front_door`
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
    sock: socket.socket,
    *,
    shutdown_timeout: float,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve `app` on the listening socket `sock` (`proxy.web.listener.bind_listener`) in this process until SIGTERM or
    SIGINT, then shut down gracefully (like `web.run_app`).

    `shutdown_timeout`: how long requests in flight may take to finish after the signal;
    `on_listening`: called once the application listens.
    """
    limits = ConnectionLimits.from_settings(settings)
    pin_mmap_threshold()

    async def listen(runner: web.AppRunner) -> list[asyncio.Server]:
        listeners = [await start_listener(runner, ssl_context, limits, sock=sock)]
        if on_listening is not None:
            on_listening()
        return listeners

    loop = new_event_loop(settings.server.event_loop)
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
