"""Request id, access log, metrics, and rendering of every error as `{"errors": [...]}`."""

from __future__ import annotations

import time

import structlog
from aiohttp import web

from proxy.errors import ProxyError
from proxy.log import begin_request, new_request_id, request_cache_status
from proxy.web.keys import METRICS
from proxy.web.responses import error_response

log = structlog.get_logger("proxy.access")


@web.middleware
async def request_context(request: web.Request, handler) -> web.StreamResponse:
    """Bind a request id, time the request, log it, and turn errors into JSON bodies."""
    request_id = new_request_id(request.headers.get("X-Request-Id"))
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    begin_request()
    started = time.perf_counter()
    response = await _render_errors(request, handler)
    response.headers["X-Request-Id"] = request_id
    duration = time.perf_counter() - started
    route = request.match_info.route.name or "unmatched"
    metrics = request.app[METRICS]
    metrics.requests.labels(route, str(response.status)).inc()
    metrics.request_seconds.labels(route).observe(duration)
    sent = response.body_length if response.prepared else (response.content_length or 0)
    log.info("request", method=request.method, path=request.path, status=response.status,
             bytes=sent, duration_ms=round(duration * 1000, 2), cache=request_cache_status(),
             remote=request.remote, user_agent=request.headers.get("User-Agent", ""))
    return response


async def _render_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as exc:
        if not exc.expected:
            log.warning("request.failed", error=exc.message, code=exc.code, status=exc.status)
        return error_response(exc.status, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = "no such endpoint" if exc.status == 404 else exc.reason
        return error_response(exc.status, f"{reason}: {request.method} {request.path}")
    except Exception:
        log.exception("request.crashed")
        return error_response(500, "internal error; see the proxy log for the request id")
