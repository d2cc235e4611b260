"""Every request gets its time budget for waiting on upstreams (`proxy.deadline`)."""

from __future__ import annotations

from aiohttp import web

from proxy.deadline import request_budget
from proxy.web.keys import SETTINGS


@web.middleware
async def request_deadline(request: web.Request, handler) -> web.StreamResponse:
    """Bound the request's waits on upstream fetches by --request-deadline and --stale-deadline."""
    settings = request.app[SETTINGS]
    with request_budget(settings.request_deadline, settings.stale_deadline):
        return await handler(request)
