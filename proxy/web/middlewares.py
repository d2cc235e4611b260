"""Request id, time budget, access log, metrics, and rendering of every error as `{"errors": [...], "code": ...}`.

Every request gets its budget for waiting on upstreams (`proxy.runtime.deadline`: --request-deadline and
--stale-deadline) here, in the one middleware every request passes through.

The access log (`--access-log`) has a line per request (`all`), only for errors and slow requests
(`errors`: status 400 and above, or slower than `SLOW_REQUEST` seconds), or none (`off`); the
request metrics are kept in every mode.

Every error answer is an error of the proxy's hierarchy (`proxy.errors`), rendered as
`{"errors": [message], "code": ...}` with its status and headers: the pure modules raise neutral
errors, and those that mean the request named something malformed (`INVALID_REQUEST_ERRORS`) are
answered as `InvalidAddressError`; aiohttp's own refusals (no route, another method) and crashes are
turned into errors of the hierarchy here too.

Behind trusted reverse proxies (`--trusted-proxies`), the request is first seen as the client made it: the
client's address from the
forwarding headers (`proxy.protocol.forwarded`) in `request.remote` first, so the log and everything else that
uses the peer sees the client, and keeps the scheme and host the client used for the URLs the proxy
writes (`client_origin`). Health probes (`/healthz`, `/readyz`) are logged at debug, not in the access log.
Every answer says `Server: registry-proxy`, without versions (`server_header`); metadata answers get their
`Cache-Control` here (`proxy.web.cache_headers`).

A client that goes away mid-request is not a server error: it is logged as `request.aborted`
and counted with status 499 (nginx's "client closed request"), and the exception goes on to
aiohttp, which drops the connection.
"""

from __future__ import annotations

import asyncio
import os
import time

import structlog
from aiohttp import web

from proxy.domain.addresses import AddressError
from proxy.errors import (
    EndpointNotFoundError,
    HttpRefusalError,
    HttpVersionNotSupportedError,
    InternalError,
    InvalidAddressError,
    MethodNotAllowedError,
    ProxyError,
    RequestBodyTooLargeError,
)
from proxy.identity.tokens import Client
from proxy.metadata_store.memory import MemoryFront
from proxy.protocol.forwarded import ClientView, client_view
from proxy.runtime.deadline import budget
from proxy.runtime.log import access, new_request_id, request_cache_status, request_line
from proxy.runtime.request_state import begin_request
from proxy.settings.config import Settings
from proxy.web.access import CLIENT
from proxy.web.app_keys import MEMORY_FRONT, METRICS, SETTINGS
from proxy.web.cache_headers import add_cache_headers
from proxy.web.policy_checks import app_gatekeeper
from proxy.web.responses import error_response

log = structlog.get_logger("proxy.access")

SERVER = "registry-proxy"  # the Server header: no versions
HEALTH_ROUTES = frozenset({"healthz", "readyz"})

CLIENT_CLOSED_REQUEST = 499
SLOW_REQUEST = 1.0  # seconds: `--access-log errors` logs requests slower than this too
SUPPORTED_VERSIONS = ((1, 0), (1, 1))
# Neutral errors of pure modules that mean the client asked for something malformed: 400.
INVALID_REQUEST_ERRORS: tuple[type[Exception], ...] = (AddressError,)


FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host")
CLIENT_VIEW = web.RequestKey("client_view", ClientView)


def request_arrived(request: web.BaseRequest) -> None:
    """Tell the connection its request head arrived: its request-head timer stops
    (`proxy.web.server.LimitedConnection`)."""
    transport = request.transport
    arrived = getattr(transport.get_protocol(), "request_arrived", None) if transport is not None else None
    if arrived is not None:
        arrived()


def as_the_client_made_it(request: web.Request, settings: Settings | None) -> web.Request:
    """With --trusted-proxies, the request as the client made it: its address in `request.remote`, and the
    scheme and host it used for `client_origin`."""
    if settings is None or not settings.server.trusted_proxies:
        return request
    view = client_view(
        request.remote,
        {name: request.headers.getall(name, ()) for name in FORWARDING_HEADERS},
        settings.server.trusted_proxies,
        rfc7239=settings.server.forwarded_headers == "forwarded",
    )
    if view.remote != request.remote:
        request = request.clone(remote=view.remote)
    request[CLIENT_VIEW] = view
    return request


def client_origin(request: web.Request) -> tuple[str, str | None]:
    """The scheme and host (its `Host` header; None without one) the client used for this request, as a trusted
    proxy forwarded them, else as this server received it. The URL the proxy writes for a client is
    `--public-url` when set, else this origin."""
    view = request.get(CLIENT_VIEW)
    scheme = (view.scheme if view else None) or request.scheme
    host = (view.host if view else None) or request.headers.get("Host")
    return scheme, host


async def server_header(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: replace aiohttp's `Server: Python/3.x aiohttp/3.x`."""
    response.headers["Server"] = SERVER


@web.middleware
async def request_context(request: web.Request, handler) -> web.StreamResponse:
    """The one middleware around every request (one layer, one await, on the warm path): tell the connection its
    request head arrived, see the request as the client made it, begin its state (`proxy.runtime.request_state`: its
    id and time budget), follow purges made elsewhere, time it, log it, and turn errors into JSON bodies."""
    request_arrived(request)
    app = request.app
    settings = app.get(SETTINGS)
    request = as_the_client_made_it(request, settings)
    request_id = new_request_id(request.headers.get("X-Request-Id"))
    limits = settings.limits if settings is not None else None
    begin_request(request_id, budget(limits.request_deadline, limits.stale_deadline) if limits is not None else None)
    started = time.perf_counter()
    try:
        front = app.get(MEMORY_FRONT)
        if front is not None and front.purge_check_due():
            await _follow_purges(front)
        if (request.version.major, request.version.minor) not in SUPPORTED_VERSIONS:
            version = f"HTTP/{request.version.major}.{request.version.minor}"
            response = _proxy_error_response(HttpVersionNotSupportedError(f"HTTP version not supported: {version}"))
        else:
            try:
                response = await handler(request)
            except Exception as exc:
                answer = _error_answer(request, exc)
                if answer is None:
                    raise
                response = answer
        route = request.match_info.route.name or "unmatched"
        client = request.get(CLIENT)
        add_cache_headers(request, response, route, client, settings, app_gatekeeper(app))
    except (ConnectionError, asyncio.CancelledError) as exc:
        record_request(
            request,
            app,
            settings,
            request.match_info.route.name or "unmatched",
            request.get(CLIENT),
            request_id,
            "request.aborted",
            CLIENT_CLOSED_REQUEST,
            request.writer.output_size,
            started,
            error=type(exc).__name__,
        )
        raise
    response.headers["X-Request-Id"] = request_id
    response.headers["Server"] = SERVER  # before aiohttp's own headers, as `proxy.web.front_door` sends it
    sent = response.body_length if response.prepared else (response.content_length or 0)
    record_request(request, app, settings, route, client, request_id, "request", response.status, sent, started)
    return response


async def _follow_purges(front: MemoryFront) -> None:
    """Before the request is served, the purge mark is read (when it is due): this process drops what it remembers
    when anything was purged since (in any process)."""
    if await front.follow_purges():
        log.info("purge.memos_dropped", pid=os.getpid(), reason="a purge elsewhere")


def record_request(
    request: web.Request,
    app: web.Application,
    settings: Settings | None,
    route: str,
    client: Client | None,
    request_id: str,
    event: str,
    status: int,
    sent: int,
    started: float,
    cache: str | None = None,
    **extra,
) -> None:
    """The request metrics, and its access-log line if `--access-log` wants it; `cache`: the cache outcome the answer
    stands for when the request's state did not note it (`proxy.web.front_door`: a warm answer reused is a hit)."""
    duration = time.perf_counter() - started
    app[METRICS].count_request(route, status, duration, cache)
    mode = settings.logging.access_log if settings is not None else "all"
    if route in HEALTH_ROUTES:
        log.debug(event, method=request.method, path=request.path, status=status, remote=request.remote)
    elif mode == "all" or (mode == "errors" and (status >= 400 or duration >= SLOW_REQUEST)):
        cache = cache or request_cache_status()
        user_agent = request.headers.get("User-Agent", "")
        if client is None and not extra:  # the usual line, formatted directly
            request_line(
                event,
                request.method,
                request.path,
                status,
                sent,
                int(duration * 100_000 + 0.5) / 100,  # milliseconds, two decimals (as `round`, without its cost)
                cache,
                request.remote,
                user_agent,
                request_id,
                _process.pid,
            )
            return
        fields = {
            "method": request.method,
            "path": request.path,
            "status": status,
            "bytes": sent,
            "duration_ms": round(duration * 1000, 2),
            "cache": cache,
            "remote": request.remote,
            "user_agent": user_agent,
            "request_id": request_id,
            "pid": _process.pid,  # which worker answered (`serve --workers N`)
        }
        if client is not None:  # who the request came from, when it showed a token (or a grant): never the token
            fields["client"] = client.identity.fields()
        if extra:
            fields.update(extra)
        access(event, fields)


class _Process:
    """This process's id, known without a system call per request (forked workers learn their own)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.pid = os.getpid()


_process = _Process()


def _error_answer(request: web.Request, exc: Exception) -> web.Response | None:
    """The JSON answer to what the handler raised (None: the exception goes on, to aiohttp)."""
    if isinstance(exc, INVALID_REQUEST_ERRORS):
        return _proxy_error_response(InvalidAddressError(str(exc)))
    if isinstance(exc, ProxyError):
        return _proxy_error_response(exc)
    if isinstance(exc, web.HTTPException):
        return None if exc.status < 400 else _proxy_error_response(_framework_error(request, exc))
    if isinstance(exc, ConnectionError) and _client_gone(request):
        return None
    log.exception("request.crashed", exc_info=exc)
    return error_response(InternalError("internal error; see the proxy log for the request id"))  # logged above


def _framework_error(request: web.Request, exc: web.HTTPException) -> ProxyError:
    """A refusal aiohttp raised itself (no route, another method, a body too large) as an error of the hierarchy."""
    what = f"{request.method} {request.path}"
    if exc.status == 404:
        return EndpointNotFoundError(f"no such endpoint: {what}")
    if exc.status == 405:
        return MethodNotAllowedError(f"{exc.reason}: {what}", headers={"Allow": exc.headers.get("Allow", "")})
    if exc.status == 413:
        return RequestBodyTooLargeError(f"{exc.reason}: {what}")
    return HttpRefusalError(f"{exc.reason}: {what}", exc.status)


def _proxy_error_response(exc: ProxyError) -> web.Response:
    """The error as JSON with its status and headers; unexpected errors are logged."""
    if not exc.expected:
        log.warning("request.failed", error=exc.message, code=exc.code, status=exc.status)
    return error_response(exc)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
