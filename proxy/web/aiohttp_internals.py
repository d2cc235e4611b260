"""The one module that relies on aiohttp's internals (the version is pinned in constraints.txt).

aiohttp answers a request it cannot parse (a request line or header field too long, too many header
fields, a bad method or version) on its own, in plain text, before any middleware or signal sees it, and
nothing public changes that answer (aio-libs/aiohttp#3287, open since 2018). So `JsonErrorRequestHandler`
subclasses aiohttp's per-connection protocol (`aiohttp.web_protocol.RequestHandler`, built the way
`web.Server` builds it) and overrides `handle_error`, which aiohttp calls with the parser's exception;
`describe_parse_error` reads that exception (its class and, for a line too long, the limit in its args).

The server's handler of every request is put behind `proxy.web.front_door` by replacing the low-level server's
`request_handler` (the application's `_handle`, which every connection's protocol takes when it is made):
`put_in_front`. The front door writes a warm answer whole (head and body, one write through the request's public
`writer`) and returns a response that is already sent (`send_whole`): aiohttp's protocol then calls its `prepare`
and `write_eof` (nothing left to do) and reads its `keep_alive` (`RequestHandler.finish_response` and `start`), and
asks nothing else of it with its own access log off.

Everything else of the server uses public interfaces: the handler is an asyncio protocol that
`proxy.web.server` wraps, and the connection limits live in that wrapper. When an aiohttp release changes
what this module relies on, tests/unit/test_library_internals.py fails and says what changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

Reject = Callable[[web.BaseRequest, int, "BaseException | None"], web.StreamResponse]
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Front(Protocol):
    """What an application may put in front of its own handler (`FRONT`)."""

    def open(self, inner: Handler) -> Handler:
        """The handler of every request, in front of `inner` (the application's routing and middlewares)."""
        ...


FRONT = web.AppKey("front", Front)


def put_in_front(runner: web.AppRunner) -> None:
    """Have the connections of `runner`'s server (after `runner.setup()`: the application has started) hand every
    request to the application's `FRONT`, when it has one, in front of the application's own handler."""
    front = runner.app.get(FRONT)
    server = runner.server
    if front is not None and server is not None:
        server.request_handler = front.open(server.request_handler)


class _Sent(web.StreamResponse):
    """A response already written whole through `request.writer`: nothing to prepare or end; the connection stays
    open after it when `keep_alive`. Immutable, so one of each kind serves every request."""

    def __init__(self, keep_alive: bool) -> None:
        super().__init__()
        self._keeps = keep_alive

    @property
    def keep_alive(self) -> bool:
        return self._keeps

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


_SENT = (_Sent(False), _Sent(True))


async def send_whole(request: web.BaseRequest, whole: bytes, keep_alive: bool) -> web.StreamResponse:
    """Send `whole` (an HTTP/1 response: status line, header fields, blank line, body) as the answer to `request`;
    what the request handler returns to aiohttp then. `keep_alive`: the connection stays open after it (then the
    answer says so as HTTP/1.0 and HTTP/1.1 need: `request.keep_alive`)."""
    await request.writer.write_eof(whole)
    return _SENT[keep_alive]


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol; a request the application never sees (unparsable, or a failure
    outside it) is answered by `reject(request, status, exception)`."""

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, reject: Reject, **options) -> None:
        super().__init__(manager, loop=loop, **options)
        self._reject = reject

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, ConnectionError):  # the client went away: nothing to answer
            raise exc
        if request.writer.output_size > 0:
            raise ConnectionError("response already started")
        return self._reject(request, status, exc)


def new_request_handler(
    server: web.Server,
    reject: Reject,
    *,
    keepalive_timeout: float,
    max_line_size: int,
    max_field_size: int,
    max_headers: int,
) -> RequestHandler:
    """A protocol for one connection of `server` (an AppRunner's `server`), with aiohttp's own access log off."""
    return JsonErrorRequestHandler(
        server,
        loop=asyncio.get_running_loop(),
        reject=reject,
        access_log=None,
        keepalive_timeout=keepalive_timeout,
        max_line_size=max_line_size,
        max_field_size=max_field_size,
        max_headers=max_headers,
    )


def describe_parse_error(
    exc: BaseException | None, *, max_line: int, max_field: int, max_headers: int
) -> tuple[int, str] | None:
    """Status and a fixed message for a request aiohttp could not parse (the client's bytes are never
    echoed back); None for anything else."""
    if isinstance(exc, http_exceptions.LineTooLong):
        if exc.args[1:2] == (max_line,):  # LineTooLong(line, limit, actual): the request line's limit
            return 414, f"request line too long: at most {max_line} bytes"
        return 431, f"request header fields too large: at most {max_field} bytes each"
    if isinstance(exc, http_exceptions.BadHttpMessage) and "Too many headers" in exc.message:
        return 431, f"request header fields too large: at most {max_headers} fields"
    if isinstance(exc, http_exceptions.BadHttpMethod):
        return 400, "malformed request: invalid method"
    if isinstance(exc, http_exceptions.BadStatusLine):
        return 400, "malformed request: invalid request line or HTTP version"
    if isinstance(exc, http_exceptions.HttpProcessingError):
        return 400, f"malformed request: {type(exc).__name__}"
    return None
