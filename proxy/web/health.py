"""`/healthz` (the process answers), `/readyz` (stores reachable) and `/metrics`."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.web.keys import METRICS, MIRROR
from proxy.web.responses import json_response


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks = await request.app[MIRROR].ready()
    ready = all(checks.values())
    return json_response({"status": "ready" if ready else "not ready", "checks": checks},
                         status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz, name="healthz")
    app.router.add_get("/readyz", readyz, name="readyz")
    app.router.add_get("/metrics", metrics, name="metrics")
